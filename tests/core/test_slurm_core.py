"""The OLMo-core SLURM scripts (scripts/slurm/*core*): valid bash, and the launcher outside a job says what to do.
A job on a real SLURM is what tests/test_slurm.py runs for the ai2-olmo scripts; these share its layout."""

from __future__ import annotations

import os
import subprocess

import pytest

from .training import ROOT

SCRIPTS = sorted((ROOT / "scripts" / "slurm").glob("*core*"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_launcher_outside_a_job_is_refused_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        ["bash", "scripts/slurm/launch-core.sh", "2", "configs/olmocore/tiny-stage2-repo.py"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "runs inside a SLURM job" in done.stderr or ".venv-core is missing" in done.stderr


def test_sbatch_scripts_run_the_olmo_core_configs():
    for name, config in (
        ("train-core-cpu.sbatch", "tiny-stage2-repo.py"),
        ("train-core-7B.sbatch", "OLMo-3-1025"),
    ):
        text = (ROOT / "scripts" / "slurm" / name).read_text()
        assert "--signal=USR1@" in text and "--requeue" in text and "launch-core.sh" in text
        assert f"configs/olmocore/{config}" in text
