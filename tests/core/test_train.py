"""Training with OLMo-core's Trainer on CPU: two gloo processes, FSDP as OLMo-core applies it, from a stage-1
checkpoint with optimizer state; killed after a checkpoint and resumed, with the losses of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

from olmo_repo.demo import BASE_DIR
from olmo_repo.olmocore.hf import hf_to_core
from olmo_repo.olmocore.stage1 import is_f_phi_key

from .training import ROOT, TINY, metrics, random_corpus, stage1_checkpoint

pytestmark = pytest.mark.slow  # three two-process training runs

STEPS = 8  # the kill lands while the run has steps to go, even on a loaded machine


def _command(save_folder: Path, data: Path, stage1: Path) -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    return [
        str(torchrun), "--nproc-per-node=2", "--standalone", str(ROOT / "scripts" / "core_train.py"), str(TINY),
        f"--save-folder={save_folder}", f"--data-root={data}", f"--load_path={stage1}",
        f"--trainer.max_duration.value={STEPS}", "--trainer.callbacks.checkpointer.save_interval=2",
        "--trainer.callbacks.checkpointer.max_checkpoints=10",  # step 0 is compared with the stage-1 start
        "--trainer.callbacks.niah.enabled=false",  # in-loop NIAH: test_stage1.py
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _run(command: list[str], log: Path) -> None:
    with log.open("a") as out:
        done = subprocess.run(command, env=_env(), stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert done.returncode == 0, log.read_text()[-3000:]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    data = random_corpus(root / "data")
    base = hf_to_core(BASE_DIR, root / "base")
    return data, stage1_checkpoint(root / "stage1", data, base)


def _flat(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an OLMo-core checkpoint, unsharded, by flattened key."""
    keys = [k for k, v in get_checkpoint_metadata(path).state_dict_metadata.items() if hasattr(v, "size")]
    return dict(zip(keys, load_keys(path, keys), strict=True))


def test_two_process_fsdp_run_from_stage1_resumes_after_a_kill_as_uninterrupted(inputs, tmp_path):
    data, stage1 = inputs
    whole = tmp_path / "whole"
    _run(_command(whole, data, stage1), tmp_path / "whole.log")

    # Stage-1 initialisation under FSDP on two ranks, as the step-0 checkpoint holds it: base tensors and AdamW
    # state bit-exact, f_phi new with fresh state, nothing else missing or added.
    start, source = (
        _flat(whole / "step0" / "model_and_optim"),
        _flat(stage1 / "model_and_optim"),
    )
    tensors = {k for k in start if k.startswith(("model.", "optim.state."))}
    assert {k for k in tensors if k not in source} == {k for k in tensors if is_f_phi_key(k)} != set()
    for key in tensors & set(source):
        assert torch.equal(start[key], source[key]), key
    assert all(start[k].abs().max() == 0 for k in tensors if is_f_phi_key(k) and k.endswith("exp_avg"))

    # Killed (SIGKILL, all processes) once the step-2 checkpoint is complete, then the same command again.
    killed = tmp_path / "killed"
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        proc = subprocess.Popen(_command(killed, data, stage1), env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 900
        while not (killed / "step2").is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        # torchrun starts each worker in a session of its own: kill every process of the tree, as SLURM or an
        # out-of-memory kill of the job would.
        for process in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            process.send_signal(signal.SIGKILL)
        proc.wait()
    latest = max(int(p.name[4:]) for p in killed.glob("step*") if p.name[4:].isdigit())
    assert 2 <= latest < STEPS, log.read_text()[-3000:]  # killed mid-run, after a checkpoint
    _run(_command(killed, data, stage1), log)
    assert (
        f"Loading checkpoint from '{killed / f'step{latest}'}'" in log.read_text()
    )  # resumed, not restarted

    a, b = metrics(whole), metrics(killed)
    assert sorted(a) == sorted(b) and max(a) == STEPS
    for step in range(1, STEPS + 1):
        assert b[step]["train/CE loss"] == a[step]["train/CE loss"], step
