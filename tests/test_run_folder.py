"""A run folder through the real Trainer and checkpointer: resuming refuses another model and logs other
changes, falls back past a corrupt checkpoint, and damaged or missing inputs fail with one line, before
anything is written."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import socket
import subprocess
import zlib
from pathlib import Path

import pytest
import torch
from olmo.exceptions import OLMoCheckpointError, OLMoConfigurationError

from olmo_repo.ai2olmo.run_folder import latest_intact_checkpoint, trim_data_indices
from olmo_repo.metrics import trim_metrics

from .training import (
    STAGE1,
    STAGE2_REPO,
    make_trainer,
    small,
    subprocess_env,
    train_command,
    truncate,
    write_corpus,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, device):
    """A RoPE run with checkpoints at steps 2 and 4, and its data."""
    root = tmp_path_factory.mktemp("rope-run")
    data = write_corpus(root / "data")
    overrides = small(data, root / "run", max_duration=4, stop_at=4, save_interval_unsharded=2)
    with make_trainer(STAGE1, overrides + ["save_num_unsharded_checkpoints_to_keep=-1"], device) as trainer:
        trainer.fit()
    return root / "run", data


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run", symlinks=True)  # OLMo links latest-unsharded to the latest
    return tmp_path / "run"


def test_resuming_with_another_model_is_refused_with_the_keys(rope_run, tmp_path, device):
    run, data = rope_run
    run = _copy(run, tmp_path)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(
        OLMoConfigurationError,
        match=r"holds checkpoints of a different model \(.*step4-unsharded\): model\.pe_mode: 'rope' -> 'repo'; "
        r"model\.pe_start_layer: 0 -> 1\. Train this config in a new --save_folder \(add --load_path=",
    ):
        make_trainer(STAGE2_REPO, small(data, run, max_duration=6), device)
    assert sorted(p.name for p in run.iterdir()) == before


def test_resuming_logs_the_other_changed_keys(rope_run, tmp_path, device, caplog):
    run, data = rope_run
    run = _copy(run, tmp_path)
    with caplog.at_level(logging.WARNING, logger="olmo_repo.ai2olmo"):
        with make_trainer(
            STAGE1, small(data, run, max_duration=6, stop_at=6) + ["optimizer.learning_rate=5e-4"], device
        ) as trainer:
            assert trainer.global_step == 4
    assert (
        "settings changed since: max_duration: 4 -> 6; optimizer.learning_rate: 0.003 -> 0.0005"
        in caplog.text
    )


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_intact_one(
    rope_run, tmp_path, device, caplog
):
    run, data = rope_run
    run = _copy(run, tmp_path)
    truncate(run / "step4-unsharded/model.pt")
    overrides = small(data, run, max_duration=4, stop_at=4, save_interval_unsharded=2)
    with caplog.at_level(logging.WARNING, logger="olmo_repo"):
        with make_trainer(STAGE1, overrides, device) as trainer:
            assert trainer.global_step == 2
            trainer.fit()  # writes step 4 again
    assert "step4-unsharded is corrupt" in caplog.text and "model.pt" in caplog.text
    assert (run / "step4-unsharded.corrupt/model.pt").is_file()  # moved aside, not deleted
    original = torch.load(rope_run[0] / "step4-unsharded/model.pt", weights_only=True)
    again = torch.load(run / "step4-unsharded/model.pt", weights_only=True)
    # The same training again (deterministic on CPU).
    assert all(torch.equal(again[k], v) for k, v in original.items())
    # metrics.jsonl had steps 1-4; steps 3 and 4 were logged again: each step is there once, as before.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before = [json.loads(line) for line in (rope_run[0] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [r["step"] for r in before] == [1, 2, 3, 4]
    assert [r["train/CrossEntropyLoss"] for r in records] == [r["train/CrossEntropyLoss"] for r in before]


def test_records_after_the_resumed_step_are_dropped_and_a_cut_stream_is_repaired(tmp_path):
    """What a run killed after its step-2 checkpoint leaves: steps 3 and 4 recorded, the last line and (for the
    data indices) the gzip member cut short. The resumed run records from step 3 again."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(json.dumps({"step": i, "loss": 1.0 / i}) + "\n" for i in (1, 2, 3)) + '{"step": 4'
    )
    trim_metrics(metrics, 2)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]

    indices = tmp_path / "rank0.tsv.gz"
    with gzip.open(indices, "wt") as f:  # an earlier start, closed cleanly
        f.write("1\t5\t6\n")
    cut = zlib.compressobj(wbits=31)  # the killed start: flushed lines, then no end
    stream = cut.compress(b"2\t7\t8\n3\t9\t1\n4\t2") + cut.flush(zlib.Z_SYNC_FLUSH)
    indices.write_bytes(indices.read_bytes() + stream)
    with pytest.raises((EOFError, zlib.error)):
        gzip.decompress(indices.read_bytes())
    trim_data_indices(indices, 2)
    assert gzip.decompress(indices.read_bytes()) == b"1\t5\t6\n2\t7\t8\n"
    before = indices.read_bytes()
    trim_data_indices(indices, 2)  # nothing to drop: the file stays as it is
    assert indices.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl",
        "rank0.tsv.gz",
    ]


def test_latest_intact_checkpoint_covers_sharded_folders_and_refuses_when_none_is_left(tmp_path):
    run = tmp_path / "run"
    for name, files in {
        "step2-unsharded": ["model.pt", "optim.pt", "train.pt"],
        "step4": ["train/rank0.pt", "model_and_optim/rank0.pt"],  # sharded: preferred at the same step
        "step4-unsharded": ["model.pt", "optim.pt", "train.pt"],
        "step6": ["train/rank0.pt", "train/rank1.pt"],
    }.items():
        for file in files + ["config.yaml"]:
            (run / name / file).parent.mkdir(parents=True, exist_ok=True)
            torch.save({"x": torch.zeros(1000)}, run / name / file)
    assert latest_intact_checkpoint(run) == run / "step6"
    truncate(run / "step6/train/rank1.pt")
    assert latest_intact_checkpoint(run) == run / "step4"
    assert (run / "step6.corrupt").is_dir()
    (run / "step4/model_and_optim/rank0.pt").write_bytes(b"")
    (run / "step4-unsharded/optim.pt").unlink()
    assert latest_intact_checkpoint(run) == run / "step2-unsharded"
    assert {"step4.corrupt", "step4-unsharded.corrupt"} <= {p.name for p in run.iterdir()}
    truncate(run / "step2-unsharded/train.pt")
    with pytest.raises(
        OLMoCheckpointError, match=r"no intact checkpoint in .*step2-unsharded/train\.pt: truncated"
    ):
        latest_intact_checkpoint(run)


def test_a_truncated_load_path_file_fails_with_one_line_before_anything_is_written(
    rope_run, tmp_path, device
):
    run, data = rope_run
    broken = tmp_path / "broken"
    shutil.copytree(run / "step2-unsharded", broken)
    truncate(broken / "model.pt")
    save = tmp_path / "stage2"
    with pytest.raises(
        OLMoCheckpointError, match=rf"load_path={broken} cannot be loaded: {broken}/model\.pt: truncated"
    ):
        make_trainer(STAGE2_REPO, small(data, save, load_path=broken), device)
    assert not save.exists() or not any(save.iterdir())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_wandb_fails_with_one_line_and_the_corrected_command_runs(tmp_path):
    """W&B online without network (its endpoint refuses on loopback): a bounded wait, one line that says
    what to do, and the corrected command runs in the same save_folder."""
    data = write_corpus(tmp_path / "data")
    overrides = small(data, tmp_path / "run", max_duration=1, stop_at=1)
    offline_machine = subprocess_env(
        WANDB_MODE="online",
        WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}",
        WANDB_API_KEY="x" * 40,
        WANDB_INIT_TIMEOUT="2",
    )
    command = train_command(STAGE1, overrides + ["wandb={project: p, entity: null}"])
    result = subprocess.run(command, env=offline_machine, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Starting W&B (online; gives up after 2 s" in result.stdout + result.stderr
    assert "W&B did not start (" in result.stderr and "set WANDB_MODE=offline" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "run").exists()  # the failed start removed the folder it created (and wandb/)
    fixed = subprocess.run(
        train_command(STAGE1, overrides + ["wandb=null"]), env=offline_machine, capture_output=True, text=True
    )
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    assert json.loads((tmp_path / "run/metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
