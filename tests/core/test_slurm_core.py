"""The OLMo-core SLURM scripts (scripts/slurm/*core*, and launch.sh given an OLMo-core config): valid bash, and a bad
input refused before the job's nodes start. A job on a real SLURM is what tests/test_slurm.py runs for the ai2-olmo
scripts; these share its launch.sh."""

from __future__ import annotations

import os
import subprocess

import pytest

from .training import ROOT

SCRIPTS = [*sorted((ROOT / "scripts" / "slurm").glob("*core*")), ROOT / "scripts" / "slurm" / "launch.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_a_jobs_bad_input_is_one_line_before_any_node_starts(tmp_path):
    """launch.sh, given an OLMo-core config, checks the run for all its nodes (`core_train.py --check`) before anything asks SLURM."""
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_NNODES": "3"}
    (data := tmp_path / "data").mkdir()
    (data / "stage2.npy").write_bytes(b"\0" * 4 * 512 * 8)
    done = subprocess.run(
        ["bash", "scripts/slurm/launch.sh", "1", "configs/olmocore/tiny-stage2-repo.py",
         f"--save-folder={tmp_path / 'run'}", f"--data-root={data}"],
        cwd=ROOT, env={**os.environ, **job}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and "job 7, start 1, nodes node[1-3]" in done.stdout
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == [
        "core_train.py: error: data_loader.global_batch_size=4096 tokens does not split into 3 data-parallel "
        "rank(s) of whole micro-batches (train_module.rank_microbatch_size=1024 tokens): pass a "
        "--data_loader.global_batch_size that is a multiple of 3072"
    ], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_sbatch_scripts_run_the_olmo_core_configs():
    for name, config in (
        ("train-core-cpu.sbatch", "tiny-stage2-repo.py"),
        ("train-core-7B.sbatch", "OLMo-3-1025"),
    ):
        text = (ROOT / "scripts" / "slurm" / name).read_text()
        assert "--signal=USR1@" in text and "--requeue" in text and "launch.sh" in text
        assert f"configs/olmocore/{config}" in text
