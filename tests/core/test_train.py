"""Training with OLMo-core's Trainer on CPU: two gloo processes, FSDP as OLMo-core applies it, from a stage-1
checkpoint with optimizer state; killed after a checkpoint and resumed, with the losses of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

from olmo_repo.cli import core_train
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.fit import f_phi_layer
from olmo_repo.metrics import METRICS_FILE, read_metrics
from olmo_repo.modes import index_blend
from olmo_repo.olmocore.hf import HF_CONFIG, hf_to_core, recorded_stock
from olmo_repo.ownership import LOCK_FILE

from ..dead_terminal import run_to_head
from ..s3_server import loopback_s3
from ..training import holder
from .training import ROOT, TINY, metrics, random_corpus, stage1_checkpoint, tiny_experiment

pytestmark = pytest.mark.slow

STEPS = 8  # the kill lands while the run has steps to go, even on a loaded machine
LR = 3.0e-3  # tiny-stage2-repo.py's
KNOBS = (  # issue 48's: f_phi's own lr and weight decay (the base's: 0.1), the index blend over 6 of the 8 steps
    "--f_phi.lr_multiplier=3",
    "--f_phi.weight_decay=0.01",
    "--model.block.sequence_mixer.pe_blend_init=1.0",
    "--model.block.sequence_mixer.pe_blend_steps=6",
)


def _command(
    save_folder: Path | str,
    data: Path | str,
    stage1: Path | str,
    steps: int = STEPS,
    launcher: bool = False,
    knobs: tuple[str, ...] = (),
) -> list[str]:
    """torchrun of two workers, or (`launcher`) the documented start, which checks first and then starts them."""
    start = (
        [sys.executable, str(ROOT / "scripts" / "core_train.py"), "--nproc-per-node=2"]
        if launcher
        else [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node=2", "--standalone",
              str(ROOT / "scripts" / "core_train.py")]
    )  # fmt: skip
    return [
        *start, str(TINY),
        f"--save-folder={save_folder}", f"--data-root={data}", f"--load_path={stage1}",
        f"--trainer.max_duration.value={steps}", "--trainer.callbacks.checkpointer.save_interval=2",
        "--trainer.callbacks.checkpointer.max_checkpoints=10",  # step 0 is compared with the stage-1 start
        "--trainer.callbacks.niah.enabled=false",  # in-loop NIAH: test_stage1.py
        *knobs,
    ]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **extra}


def _run(command: list[str], log: Path, **env: str) -> None:
    with log.open("a") as out:
        done = subprocess.run(command, env=_env(**env), stdout=out, stderr=subprocess.STDOUT, timeout=900)
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
    """With issue 48's knobs on: f_phi's optimizer group (lr x 3, weight decay 0.01) and the index blend's p
    continue exactly across the kill, as the losses do."""
    data, stage1 = inputs
    whole = tmp_path / "whole"
    # Its standard output closed after 40 lines (`| head -40`), as rank 0 logs there: the workers go on, and say
    # nothing of it on stderr (once 1,473 lines of `--- Logging error ---`).
    log = tmp_path / "whole.err"
    status, _ = run_to_head(_command(whole, data, stage1, knobs=KNOBS), lines=40, log=log, env=_env())
    assert status == 0, log.read_text()[-3000:]
    assert "Logging error" not in log.read_text() and "Traceback" not in log.read_text()

    # Stage-1 initialisation under FSDP on two ranks, as the step-0 checkpoint holds it: base tensors and AdamW
    # state bit-exact, f_phi new with fresh state, nothing else missing or added.
    start, source = (
        _flat(whole / "step0" / "model_and_optim"),
        _flat(stage1 / "model_and_optim"),
    )
    tensors = {k for k in start if k.startswith(("model.", "optim.state."))}
    assert (
        {k for k in tensors if k not in source} == {k for k in tensors if f_phi_layer(k) is not None} != set()
    )
    for key in tensors & set(source):
        assert torch.equal(start[key], source[key]), key
    assert all(
        start[k].abs().max() == 0 for k in tensors if f_phi_layer(k) is not None and k.endswith("exp_avg")
    )

    # Killed (SIGKILL, all processes) once the step-2 checkpoint is complete, then the same command again; both
    # started as documented (`--nproc-per-node`: checked, then torchrun), the uninterrupted run by torchrun.
    killed = tmp_path / "killed"
    log = tmp_path / "killed.log"
    command = _command(killed, data, stage1, launcher=True, knobs=KNOBS)
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=_env(), stdout=out, stderr=subprocess.STDOUT,
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
    _run(command, log)
    assert (
        f"Loading checkpoint from '{killed / f'step{latest}'}'" in log.read_text()
    )  # resumed, not restarted

    a, b = metrics(whole), metrics(killed)
    assert sorted(a) == sorted(b) and max(a) == STEPS
    for run in (
        whole,
        killed,
    ):  # one record per step (checkpoint steps' later numbers merged), across the resume
        steps = [r["step"] for r in read_metrics(run / METRICS_FILE)]
        assert steps == sorted(set(steps)), steps
    scheduler = tiny_experiment(whole, data).train_module.scheduler
    for step in range(1, STEPS + 1):
        assert b[step]["train/CE loss"] == a[step]["train/CE loss"], step
        # each group's lr (embeddings, f_phi, the rest) exactly the schedule's of its initial lr, in both runs
        want = [scheduler.get_lr(initial, step, STEPS) for initial in (LR, 3 * LR, LR)]
        for run in (a, b):
            assert [run[step][f"optim/LR (group {g})"] for g in range(3)] == want, step
            assert run[step].get("train/positions/index_blend", 0.0) == index_blend(1.0, 6, step - 1), step


def test_a_live_run_owns_its_folder_and_dies_with_its_launcher(tmp_path, capsys):
    """As tests/test_train_cli.py's for ai2-olmo: the worker of the documented start holds the save folder, a
    second run is refused in one line naming it, and SIGKILL of the launcher's group kills the worker too."""
    data, run, log = random_corpus(tmp_path / "data"), tmp_path / "run", tmp_path / "run.log"
    args = [str(TINY), f"--save-folder={run}", f"--data-root={data}", "--trainer.callbacks.niah.enabled=false",
            "--trainer.max_duration.value=100000"]  # fmt: skip
    with log.open("w") as out:
        launcher = subprocess.Popen([sys.executable, str(ROOT / "scripts/core_train.py"), "--nproc-per-node=1",
                                     *args], env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
    worker = holder(run / LOCK_FILE, launcher, timeout=600)
    try:
        while not (run / "metrics.jsonl").is_file() and launcher.poll() is None:  # training, not starting
            time.sleep(0.1)
        assert core_train.main(["--check", *args]) == 1  # a second run, as its launcher checks it
        err = capsys.readouterr().err
        assert err.startswith(
            f"core_train.py: error: --save-folder={run} is in use by a live run (pid {worker.pid} on "
            f"{socket.gethostname()}, "
        ) and err.endswith("): wait for it to end or stop it, or use another save folder\n"), err
        os.killpg(launcher.pid, signal.SIGKILL)
        assert launcher.wait() == -signal.SIGKILL
        worker.wait(timeout=10)  # its parent's death noticed, by itself
    finally:
        if worker.is_running():
            worker.kill()
    assert "is gone; stopping" in log.read_text()
    assert core_train.main(["--check", *args]) == 0, capsys.readouterr().err  # free again


@pytest.mark.long
def test_s3_save_folder_and_stage1_from_a_bucket_resume_there(inputs, tmp_path):
    """OLMo-core's own S3 I/O against a real S3-compatible server: the data read from an s3:// data root, stage-1
    initialisation from an s3:// load_path, checkpoints written to an s3:// save folder carrying the stock HF config the bucket's stage 1 records (what
    the conversion back to HF keeps), and a rerun that resumes from the bucket."""
    import boto3

    data, stage1 = inputs
    # the stage-1 folder will record the base's stock config, as a stage 1 converted from HF records it
    stock = recorded_stock(stage1.parent / "base")
    assert stock and stock["max_position_embeddings"]
    work, log = tmp_path / "work", tmp_path / "s3.log"
    with loopback_s3() as env:
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_DEFAULT_REGION"],
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        s3.create_bucket(Bucket="ckpts")
        for file in (f for f in stage1.rglob("*") if f.is_file()):
            s3.upload_file(str(file), "ckpts", f"stage1/{file.relative_to(stage1)}")
        s3.upload_file(str(stage1.parent / "base" / "config.json"), "ckpts", "stage1/config.json")
        for file in data.iterdir():  # the data root on S3 too (stage2.npy, tokenizer.json)
            s3.upload_file(str(file), "ckpts", f"data/{file.name}")

        def run(steps: int) -> str:
            command = _command("s3://ckpts/runs/tiny", "s3://ckpts/data", "s3://ckpts/stage1", steps)
            _run([*command, f"--work-dir={work}"], log, **env)
            return log.read_text()

        text = run(4)
        assert "Initialising from s3://ckpts/stage1" in text, text[-3000:]
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]}
        assert {f"runs/tiny/step{step}/model_and_optim/.metadata" for step in (2, 4)} <= keys
        saved = json.loads(s3.get_object(Bucket="ckpts", Key="runs/tiny/step4/config.json")["Body"].read())
        assert saved[HF_CONFIG] == stock
        assert saved["dataset"]["paths"] == [
            "s3://ckpts/data/stage2.npy"
        ]  # read there, not from a local copy

        text = run(6)
        # Resumed from the bucket, not restarted from stage 1.
        assert "Loading checkpoint from 's3://ckpts/runs/tiny/step4'" in text, text[-3000:]
        assert "runs/tiny/step6/model_and_optim/.metadata" in {
            o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]
        }
    # The metrics stay local, named after the remote save folder; every step once across the two runs.
    steps = metrics(work / "metrics" / "s3" / "ckpts" / "runs" / "tiny")
    assert sorted(steps) == list(range(7)) and all("train/CE loss" in steps[s] for s in range(1, 7))


def test_a_remote_checkpoints_stock_config_missing_is_none_and_corrupt_is_one_line(monkeypatch):
    import boto3

    from olmo_repo.errors import RepoError

    with loopback_s3() as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="ckpts")
        assert recorded_stock("s3://ckpts/none") is None  # no config.json: a checkpoint that records none
        s3.put_object(Bucket="ckpts", Key="bad/config.json", Body=b"{not json")
        with pytest.raises(RepoError, match=r"^s3://ckpts/bad/config.json is not valid JSON"):
            recorded_stock("s3://ckpts/bad")
        s3.put_object(Bucket="ckpts", Key="list/config.json", Body=b"[1]")  # JSON, not a checkpoint's config
        with pytest.raises(RepoError, match=r"^s3://ckpts/list/config.json has no `model` section$"):
            recorded_stock("s3://ckpts/list/")
