"""scripts/train.py end to end in real processes: resume after a kill, 2-process DDP with W&B offline, S3
(checkpoint upload, resume and stage-1 initialisation from a bucket)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from olmo.optim import build_scheduler
from omegaconf import OmegaConf as om

from olmo_repo import RepoTrainConfig
from olmo_repo.cli import train as train_cli
from olmo_repo.modes import index_blend
from olmo_repo.ownership import LOCK_FILE

from .dead_terminal import run_to_head
from .s3_server import loopback_s3
from .training import (
    STAGE1,
    STAGE2_REPO,
    TRAIN_SCRIPT,
    cli,
    holder,
    losses,
    small,
    stop_with_sigusr1,
    subprocess_env,
    train_command,
    write_corpus,
)

pytestmark = pytest.mark.slow


def _run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, env=subprocess_env(**env), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_help_and_clear_failure_before_training(tmp_path):
    help_out = subprocess.run([sys.executable, str(TRAIN_SCRIPT), "--help"], capture_output=True, text=True)
    assert help_out.returncode == 0 and "CONFIG [--key=value ...]" in help_out.stdout
    missing = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), "configs/nope.yaml"], capture_output=True, text=True
    )
    assert missing.returncode != 0 and missing.stdout == ""
    assert (
        missing.stderr
        == "train.py: error: config file configs/nope.yaml does not exist (expected a YAML file such as configs/*.yaml)\n"
    )
    overrides = small(tmp_path / "no-data", tmp_path / "run")
    result = subprocess.run(
        train_command(STAGE1, overrides), env=subprocess_env(), capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "1 data file(s) do not exist" in result.stdout + result.stderr
    assert not (tmp_path / "run/config.yaml").exists()  # nothing was started


def _indices(save_folder: Path) -> list[str]:
    """The records of data-indices/rank0.tsv.gz (step, instance indices), read whole: a damaged stream fails."""
    return gzip.decompress((save_folder / "data-indices/rank0.tsv.gz").read_bytes()).decode().splitlines()


def _records(save_folder: Path) -> dict[int, dict]:
    """{step: metrics} of the training steps in save_folder/metrics.jsonl."""
    lines = (save_folder / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "train/CrossEntropyLoss" in r}


def _contents(root: Path) -> dict[str, bytes]:
    """{path under root: bytes} of every file."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# Learning positions (issue 48): RePo layers from layer 1 with the index blend falling from 1 over 20 steps, f_phi's
# lr 10 x the schedule's (warm-up and cosine decay) and its own weight decay (the base's: 0.1).
LEARNING = {
    "model.pe_mode": "repo",
    "model.pe_start_layer": 1,
    "model.pe_blend_init": 1.0,
    "model.pe_blend_steps": 20,
    "f_phi.lr_multiplier": 10.0,
    "f_phi.weight_decay": 0.01,
}


def test_killed_run_resumes_with_identical_losses_and_data_order(tmp_path):
    """A RePo run learning its positions (`LEARNING`): the same losses, data order, each group's lr (f_phi's the
    schedule's x 10) and index blend on every step, killed and resumed or not."""
    data = write_corpus(tmp_path / "data")
    steps = dict(max_duration=40, stop_at=40, save_interval_unsharded=4, **LEARNING)
    reference = tmp_path / "reference"
    # Its standard output closed after one line (`| head -1`): the run goes on, saying nothing of it on stderr. Its
    # writers that outlive a step (metrics.jsonl, the gzip of data-indices/) are read whole below: their last bytes
    # are on disk although the process ends through os._exit (olmo_repo.cli.command).
    log = tmp_path / "reference.err"
    command = train_command(STAGE1, small(data, reference, **steps))
    assert run_to_head(command, log=log, env=subprocess_env())[0] == 0, log.read_text()[-3000:]
    assert "Logging error" not in log.read_text() and "Traceback" not in log.read_text()
    expected = losses(reference)
    assert sorted(expected) == list(range(1, 41))

    run = tmp_path / "run"
    cmd = train_command(STAGE1, small(data, run, **steps))
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (run / "step8-unsharded").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert max(losses(run)) < 40

    result = _run(cmd)  # the same command again
    assert "Resuming from" in result.stdout
    # Each step once (the steps logged after the resumed checkpoint are dropped and logged again), and the
    # losses are the uninterrupted run's: exact float equality, fp32 on CPU. The same for the record of the
    # instances each step trained on (a kill leaves its gzip stream cut short).
    assert losses(run) == expected
    assert _indices(run) == _indices(reference) and len(_indices(run)) == 40
    cfg = RepoTrainConfig.load(STAGE1, small(data, run, **steps))
    schedule = build_scheduler(cfg)
    for step, record in _records(run).items():
        lr = schedule.get_lr(cfg.optimizer.learning_rate, step, 40)
        assert [record[f"optim/learning_rate_group{i}"] for i in range(3)] == [lr, lr, lr * 10.0], step
        assert record.get("train/positions/index_blend") == (index_blend(1.0, 20, step - 1) or None), step
    saved = torch.load(run / "step40-unsharded/optim.pt", weights_only=False)["param_groups"]
    assert [g["weight_decay"] for g in saved] == [0.1, 0.0, 0.01]
    # Rerunning a finished run does nothing, and leaves every file of the run as it was, byte for byte (OLMo's
    # data loader writes train_data/global_indices.npy again on every start, with the same bytes).
    before = _contents(run)
    assert "Nothing to do" in _run(cmd).stdout
    assert _contents(run) == before


def test_sigusr1_stops_with_a_checkpoint_and_the_rerun_continues(tmp_path):
    """What SLURM's --signal does before the time limit; tests/test_slurm.py checks the same under SLURM (requeue,
    losses). Without a save interval the stop still writes a checkpoint (OLMo's cancel path writes none then)."""
    data = write_corpus(tmp_path / "data")
    run = tmp_path / "run"
    cmd = train_command(STAGE1, small(data, run, max_duration=40, stop_at=40, save_interval_unsharded="null"))
    stopped, output = stop_with_sigusr1(cmd, run)
    assert stopped < 40 and "rerun the same command to resume" in output
    assert (run / f"step{stopped}-unsharded/model.pt").is_file()

    assert f"Resuming from {run}/step{stopped}-unsharded" in _run(cmd).stdout
    assert sorted(losses(run)) == list(range(1, 41))  # continued from the checkpoint, each step once


def test_the_launcher_checks_the_run_once_and_starts_nothing_on_a_bad_input(tmp_path, capsys):
    """`scripts/train.py --nproc-per-node` / `--check` (its `main`, in this process: no worker may start)."""
    data = write_corpus(tmp_path / "data")
    run = tmp_path / "run"

    def launch(*flags: str, **overrides: object) -> tuple[int, str, str]:
        status = train_cli.main([*flags, str(STAGE2_REPO), *cli(small(data, run, **overrides))])
        out, err = capsys.readouterr()
        return status, out, err

    # What each of two ranks would refuse: said once, in one line, before any worker starts; nothing written.
    assert launch("--nproc-per-node=2", global_train_batch_size=3) == (
        1,
        "",
        "train.py: error: config cannot train here: global_train_batch_size=3 is not divisible by the 2 ranks\n",
    )
    assert not run.exists()
    # --check, for a run of 2 nodes x 2 processes: 4 ranks, which a batch of 4 gives 1 each (micro-batch 2).
    status, _, err = launch("--check", "--nnodes=2", "--nproc-per-node", "2", global_train_batch_size=4)
    assert status == 1 and err.count("\n") == 1, err
    assert "the per-rank batch 1 (global_train_batch_size=4 over 4 rank(s))" in err
    status, out, _ = launch("--check", "--nnodes=2", "--nproc-per-node", "2", global_train_batch_size=8)
    assert (status, out) == (0, "train.py: the run can start on 2 node(s) x 2 process(es)\n")
    assert not run.exists()  # checked, nothing started
    # The knobs of learning positions: the rule set's line (what OLMo-core's side says too), nothing started.
    bad = {"model.pe_blend_init": 2, "f_phi.lr_multiplier": "nan"}
    for flag, (key, value) in zip(("--nproc-per-node=2", "--check"), bad.items(), strict=True):
        status, _, err = launch(flag, global_train_batch_size=8, **{key: value})
        assert status == 1 and err.count("\n") == 1 and err.startswith(f"train.py: error: {key}="), err
    assert (
        err
        == "train.py: error: f_phi.lr_multiplier=nan; allowed: a finite number > 0 (1: the schedule's lr)\n"
    )
    assert not run.exists()
    # An in-loop evaluator entry each rank would refuse when it builds its evaluators (after its model).
    niah = [{"label": "niah_single_1", "type": "downstream"}, {"label": "niah_bogus", "type": "downstream"}]
    status, _, err = launch("--check", "--nproc-per-node=2", global_train_batch_size=8, evaluators=niah)
    assert status == 1 and err.startswith("train.py: error: evaluators[1].label: unknown NIAH variant"), err
    assert err.count("\n") == 1 and not run.exists()
    # A length its haystack does not fit (32 tokens): each rank's build would refuse it; the check builds one prompt.
    status, _, err = launch("--check", "--nproc-per-node=2", global_train_batch_size=8, evaluators=niah[:1])
    assert status == 1 and err.count("\n") == 1 and "niah_single_1: length 32 is too short" in err, err
    with pytest.raises(SystemExit) as usage:
        launch("--nnodes=2", "--nproc-per-node=2")
    assert usage.value.code == 2 and "--nnodes is for --check" in capsys.readouterr().err


def test_a_worker_that_fails_after_the_checks_is_one_line_from_the_launcher():
    """torchrun's own ChildFailedError traceback is replaced by one line naming the failed process (the worker
    here: `python -m json.tool` of a file that does not exist, which argparse answers with exit status 2)."""
    code = "from olmo_repo.cli.launch import _torchrun; raise SystemExit(_torchrun('train.py', 'json.tool', 2, ['/nope']))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(
        r"^train\.py: error: training process [01] failed \(exit status 2\): its error is above$",
        done.stderr.splitlines()[-1],
    )


def test_a_live_run_owns_its_folder_and_dies_with_its_launcher(tmp_path, capsys):
    """The documented start (`--nproc-per-node`: a launcher, torchrun, a worker in a session of its own) holds
    its save folder in its worker: a second run on it is refused in one line naming that worker; SIGKILL of the
    launcher's process group (which does not reach the worker) and the worker dies too, freeing the folder."""
    data, run, log = write_corpus(tmp_path / "data"), tmp_path / "run", tmp_path / "run.log"
    args = [str(STAGE1), *cli(small(data, run, max_duration=100_000, stop_at=100_000))]
    with log.open("w") as out:
        launcher = subprocess.Popen([sys.executable, str(TRAIN_SCRIPT), "--nproc-per-node=1", *args],
                                    env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
    worker = holder(run / LOCK_FILE, launcher)
    try:
        while not (run / "metrics.jsonl").is_file() and launcher.poll() is None:  # training, not starting
            time.sleep(0.1)
        assert train_cli.main(["--check", *args]) == 1  # a second run, as its launcher checks it
        err = capsys.readouterr().err
        assert err.startswith(
            f"train.py: error: save_folder={run} is in use by a live run (pid {worker.pid} on {socket.gethostname()}, "
        ) and err.endswith("): wait for it to end or stop it, or use another save folder\n"), err
        os.killpg(launcher.pid, signal.SIGKILL)
        assert launcher.wait() == -signal.SIGKILL
        worker.wait(timeout=10)  # its parent's death noticed, by itself
    finally:
        if worker.is_running():
            worker.kill()
    assert "is gone; stopping" in log.read_text()
    assert train_cli.main(["--check", *args]) == 0, capsys.readouterr().err  # free again


def test_two_process_ddp_with_wandb_offline_and_position_metrics(tmp_path):
    data = write_corpus(tmp_path / "data")
    save = tmp_path / "run"
    overrides = small(
        data, save, max_duration=4, stop_at=4, save_interval_unsharded=4, console_log_interval=2
    )
    overrides += ["wandb={project: olmo-repo-test, entity: null, log_interval: 2}"]
    # The documented start: checked once here, then two workers through torchrun.
    _run([sys.executable, str(TRAIN_SCRIPT), "--nproc-per-node=2", str(STAGE2_REPO), *cli(overrides)])
    assert torch.load(save / "step4-unsharded/train.pt", weights_only=False)["world_size"] == 2
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "train/CrossEntropyLoss" in r][-1]
    assert last["step"] == 4
    for layer in (1, 2):
        lo, hi, std = (last[f"train/positions/layer{layer}/{k}"] for k in ("min", "max", "std"))
        assert lo < hi and std > 0
    assert "train/positions/layer0/std" not in last  # layer 0 uses RoPE
    runs = list((save / "wandb/wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and b"train/positions/layer2/std" in runs[0].read_bytes()
    config = (save / "config.yaml").read_text()
    assert "distributed_strategy: ddp" in config


@pytest.fixture
def s3_server():
    with loopback_s3() as env:
        yield env


def test_s3_remote_save_folder_upload_and_resume(tmp_path, s3_server, monkeypatch):
    import boto3

    for key, value in s3_server.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpts")
    data = write_corpus(tmp_path / "data")
    save = tmp_path / "run"
    overrides = small(
        data,
        save,
        max_duration=6,
        save_interval_unsharded=2,
        remote_save_folder="s3://ckpts/run",
        evaluators="[]",
    )
    _run(train_command(STAGE1, overrides + ["stop_at=4"]), **s3_server)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]}
    for step in (2, 4):
        assert {
            f"run/step{step}-unsharded/{f}" for f in ("model.pt", "optim.pt", "train.pt", "config.yaml")
        } <= keys

    shutil.rmtree(save)  # only the bucket has the checkpoints now
    result = _run(train_command(STAGE1, overrides + ["stop_at=6"]), **s3_server)
    assert "Resuming from s3://ckpts/run/step4-unsharded" in result.stdout
    assert sorted(losses(save)) == [5, 6]
    assert "run/step6-unsharded/model.pt" in {
        o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]
    }

    # The same bucket as a stage-1 store: a RePo run initialises from an s3:// load_path, and carries the stock
    # HF config it records (as convert_from_hf records it) into its own config, which convert_to_hf reads.
    key = "run/step6-unsharded/config.yaml"
    recorded = om.create(s3.get_object(Bucket="ckpts", Key=key)["Body"].read().decode())
    recorded.hf_config = {"model_type": "olmo2", "max_position_embeddings": 4096}
    s3.put_object(Bucket="ckpts", Key=key, Body=om.to_yaml(recorded).encode())
    stage2 = small(data, tmp_path / "stage2", max_duration=1, load_path="s3://ckpts/run/step6-unsharded")
    result = _run(train_command(STAGE2_REPO, stage2), **s3_server)
    assert (
        "Initialising from stage-1 checkpoint s3://ckpts/run/step6-unsharded: 6 RePo weights" in result.stdout
    )
    carried = om.load(tmp_path / "stage2" / "config.yaml").hf_config
    assert carried is not None and om.to_container(carried) == {
        "model_type": "olmo2",
        "max_position_embeddings": 4096,
    }

    # A remote checkpoint whose config.yaml is damaged: one line naming it, before the run writes anything.
    s3.put_object(Bucket="ckpts", Key="bad/config.yaml", Body=b"{not: yaml")
    bad = small(data, tmp_path / "bad-run", max_duration=1, load_path="s3://ckpts/bad")
    result = subprocess.run(
        train_command(STAGE2_REPO, bad), env=subprocess_env(**s3_server), capture_output=True, text=True
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (  # after ai2-olmo's download bar
        "train.py: error: s3://ckpts/bad/config.yaml is not valid YAML (while parsing a flow mapping)"
    )
    assert not (tmp_path / "bad-run").exists()
