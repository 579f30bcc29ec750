"""`scripts/smollm2_recipe.py` end to end at its smallest size (1 step per run, one NIAH prompt at 512 tokens) on
the real SmolLM2 directory: two of its arms (the paper's RePo and the one set up to learn positions: a step 0
of its own, and one that starts as the stock model), the held-out losses with replaced positions, the position
statistics and the report; a rerun changes nothing; a folder that is not the recipe's is refused before any
work."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from olmo_repo.cli import position_study, smollm2_recipe
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.experiments.smollm2.heldout import heldout_loss
from olmo_repo.metrics import METRICS_FILE, read_metrics
from olmo_repo.output import PNG_SIGNATURE

from .training import ROOT

# Two training runs of a 135M model, NIAH, analyses: one process at a time (--procs=1).
pytestmark = pytest.mark.slow

RECIPE = [sys.executable, str(ROOT / "scripts" / "smollm2_recipe.py")]
SMALLEST = [
    "--steps=1",
    "--samples=1",
    "--lengths=512",
    "--variants=niah_single_1",
    "--procs=1",
    "--heldout-topics=2",
    "--arms=repo,repo-learn",  # the RoPE arm is the same machinery with another override
]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*RECIPE, *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.long
def test_the_recipe_runs_both_arms_reports_and_a_rerun_changes_nothing(smollm2_dir, tmp_path):
    out = tmp_path / "recipe"
    done = _run(str(out), f"--model={smollm2_dir}", *SMALLEST)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    stages = json.loads((out / "stages.json").read_text())
    assert all(record["done"] for record in stages.values()), stages
    assert stages["data"]["heldout_tokens"] > 256 and stages["data"]["train_tokens"] > 100_000
    held = np.fromfile(out / "data" / "heldout.npy", dtype=np.uint32)
    train = np.fromfile(out / "data" / "train.npy", dtype=np.uint32)
    assert (
        len(held) == stages["data"]["heldout_tokens"] and train[-1] == held[-1] == 2
    )  # whole topics, each ended

    losses = json.loads(stages["heldout"]["losses"])
    assert list(losses) == [
        "stock", "RePo, step 0", "RePo, step 1", "RePo, learning, step 1",
        "RePo, step 1, index", "RePo, step 1, constant", "RePo, learning, step 1, index",
        "RePo, learning, step 1, constant",
    ]  # fmt: skip
    # The insertion cost: fresh f_phi predicts positions near 0, so layers 9..29 start position-less (NoPE) ...
    assert losses["RePo, step 0"] > losses["stock"] + 0.5
    # ... where the blended arm starts as the stock model (p = 1) and is still near it after one step (p = 0.98)
    assert abs(losses["RePo, learning, step 1"] - losses["stock"]) < 0.1
    assert abs(losses["RePo, learning, step 1, index"] - losses["stock"]) < 0.1
    assert losses["RePo, step 1, constant"] > losses["stock"] + 0.5
    positions = json.loads(stages["heldout"]["positions"])
    assert list(positions) == ["RePo", "RePo, learning"]
    assert all(list(layers) == [str(i) for i in range(9, 30)] for layers in positions.values())
    assert all(set(s) == {"min", "max", "std", "p05", "p95", "rank_corr"} for s in positions["RePo"].values())
    # Both arms trained the same step, logging positions for exactly their RePo layers; the blend's p on the
    # learning arm only (1 at the first step).
    records = {name: read_metrics(out / f"run-{name}" / METRICS_FILE) for name in ("repo", "repo-learn")}
    for name, logged in records.items():
        assert [r["step"] for r in logged if "train/CE loss" in r] == [1], name
        layers = {k.split("/")[2] for r in logged for k in r if k.startswith("train/positions/layer")}
        assert layers == {f"layer{i}" for i in range(9, 30)}, name
    assert [r.get("train/positions/index_blend") for r in records["repo-learn"] if "train/CE loss" in r] == [
        1.0
    ]
    assert not any("train/positions/index_blend" in r for r in records["repo"])

    report = (out / "report.md").read_text()
    for heading in ("## Insertion cost and training", "## Needle in a haystack", "## Learned positions: RePo",
                    "## What this shows, and what it does not", "rank corr"):  # fmt: skip
        assert heading in report, heading
    assert f"| stock | {losses['stock']:.4f} |" in report and "`f_phi.lr_multiplier=240`" in report
    (last,) = [r for r in records["repo-learn"] if "train/CE loss" in r]  # the training table: logged values
    std = [v for k, v in last.items() if k.startswith("train/positions/layer") and k.endswith("/std")]
    loss = last["train/CE loss"]
    assert f"| RePo, learning | 1 | {loss:.3f} | {loss:.3f} | {sum(std) / len(std):.3g} |" in report
    assert (out / "figures" / "loss.png").read_bytes().startswith(PNG_SIGNATURE)

    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = _run(str(out), f"--model={smollm2_dir}", *SMALLEST)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished before with the same inputs, skipped") == len(stages)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_heldout_loss_is_transformers_own_mean_loss_over_the_windows(smollm2_dir):
    ids = np.random.default_rng(0).integers(3, 49152, size=3 * 64 + 5, dtype=np.uint32)  # 3 windows, a rest
    got = heldout_loss(smollm2_dir, ids, window=64, batch=1)  # transformers' row shapes: only sums reorder
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    x = torch.from_numpy(ids[: 3 * 64].astype(np.int64)).view(3, 64)
    with torch.no_grad():  # transformers' loss: the mean over each window's 63 predicted tokens
        expected = torch.stack([model(row[None], labels=row[None]).loss for row in x]).mean().item()
    # fp32 sums over 49152 logits per token: relative error a few ulps times log(V)
    assert abs(got - expected) <= 64 * torch.finfo(torch.float32).eps * abs(expected)


def test_too_few_heldout_tokens_are_refused_before_any_training(smollm2_dir, tmp_path):
    out = tmp_path / "recipe"
    done = _run(str(out), f"--model={smollm2_dir}", *SMALLEST[:-1], "--heldout-topics=1")  # ~180 tokens
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and re.fullmatch(
        r"smollm2_recipe\.py: error: --heldout-topics=1 holds \d+ tokens, fewer than one window of 256: hold out "
        r"more topics",
        last,
    ), done.stderr
    assert not (out / "run-repo").exists() and not (out / "core-stock").exists()


@pytest.mark.parametrize("command", [smollm2_recipe, position_study])
def test_a_model_directory_that_smollm2_py_did_not_write_is_refused_and_nothing_is_made(
    command, tmp_path, capsys
):
    """A missing `--model`, and a stock HF directory (the demo's base model: a model of the user's, which the
    recipe's model stage once offered to rebuild with --force): one line, no folder made."""
    for model, says in ((tmp_path / "nope", "does not exist"),
                        (BASE_DIR, "is not a directory of scripts/smollm2.py (model.safetensors has no manifest")):  # fmt: skip
        code = command.main([str(tmp_path / "out"), f"--model={model}", *SMALLEST[:2]])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and f"--model {model} {says}" in err, err
        assert "--force" not in err and sorted(tmp_path.iterdir()) == []


def test_a_folder_that_is_not_the_recipes_is_refused_before_any_work(smollm2_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code = smollm2_recipe.main([str(out), f"--model={smollm2_dir}", *SMALLEST])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("smollm2_recipe.py: error:") and str(out) in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    "flag, says",
    [
        (
            "--variants=niah_single_1,niah_bogus",
            "--variants niah_single_1,niah_bogus: unknown niah_bogus; allowed: ",
        ),
        ("--variants=,", "--variants ,: none given; allowed: "),
        ("--arms=,", "--arms ,: none given; allowed: "),
        ("--arms=repo,repo", "--arms repo,repo: each arm once; allowed: "),
    ],
)
def test_bad_variants_or_arms_are_a_usage_error_before_anything_is_written(flag, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        smollm2_recipe.main([str(tmp_path / "recipe"), flag])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"smollm2_recipe.py: error: {says}")
    assert not (tmp_path / "recipe").exists()
