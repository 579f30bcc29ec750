"""metrics.jsonl as both trainers write it (`olmo_repo.metrics`) and as the demo follows it while a run grows."""

from __future__ import annotations

import json

from olmo_repo.experiments.demo.training import _Progress
from olmo_repo.metrics import append_metrics, read_metrics, trim_metrics

LOSS = "train/CrossEntropyLoss"


def test_the_calls_of_one_step_make_one_record_and_a_resume_logs_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_metrics(path, 0, {"eval/niah_single_1/exact_match": 0.0})  # evaluations before the first step
    append_metrics(path, 0, {"eval/tiny-val/CrossEntropyLoss": 8.5})
    for step in (1, 2, 3):
        append_metrics(path, step, {LOSS: 1.0 / step})
    append_metrics(path, 3, {"throughput/device/TPS": 1e3})  # logged after the step's checkpoint
    assert read_metrics(path) == [
        {"step": 0, "eval/niah_single_1/exact_match": 0.0, "eval/tiny-val/CrossEntropyLoss": 8.5},
        {"step": 1, LOSS: 1.0},
        {"step": 2, LOSS: 0.5},
        {"step": 3, LOSS: 1.0 / 3, "throughput/device/TPS": 1e3},
    ]
    # Resumed from the checkpoint of step 2: step 3 is dropped, then logged again, once.
    assert trim_metrics(path, 2) == 1
    append_metrics(path, 3, {LOSS: 0.25})
    append_metrics(path, 3, {"eval/tiny-val/CrossEntropyLoss": 7.0})
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3]
    assert read_metrics(path)[-1] == {"step": 3, LOSS: 0.25, "eval/tiny-val/CrossEntropyLoss": 7.0}
    assert 1.0 / 3 == json.loads(json.dumps(1.0 / 3))  # full precision survives the file


def test_a_long_last_record_is_merged_too(tmp_path):
    path = tmp_path / "metrics.jsonl"
    wide = {f"train/positions/layer{i}/{s}": i + 0.5 for i in range(400) for s in ("min", "max", "std")}
    append_metrics(path, 1, {LOSS: 2.0})
    append_metrics(path, 2, wide)  # a line longer than one read of the file's tail
    append_metrics(path, 2, {LOSS: 1.5})
    assert read_metrics(path) == [{"step": 1, LOSS: 2.0}, {"step": 2, **wide, LOSS: 1.5}]


def test_the_demos_progress_follows_a_step_that_gains_metrics(tmp_path, capsys):
    save = tmp_path / "run"
    save.mkdir()
    (save / "config.yaml").write_text(
        "max_duration: 2\nevaluators:\n- label: niah_single_1\n- label: niah_single_2\n"
    )
    path = save / "metrics.jsonl"
    progress = _Progress("stage2-repo", path)
    append_metrics(path, 1, {LOSS: 2.0})
    progress.update()
    append_metrics(path, 1, {"eval/niah_single_1/exact_match": 1.0})  # merged into the line already read
    progress.update()
    append_metrics(path, 1, {"eval/niah_single_2/exact_match": 0.0})
    progress.update()
    progress.update()  # nothing new: nothing printed again
    append_metrics(path, 2, {LOSS: 1.0})
    progress.update()
    assert capsys.readouterr().out.splitlines() == [
        "   stage2-repo step     1/2  loss 2.000",
        "   stage2-repo step       1  in-loop NIAH exact match 50% (mean of 2 variants)",
        "   stage2-repo step     2/2  loss 1.000  ETA 0m00s",
    ]
