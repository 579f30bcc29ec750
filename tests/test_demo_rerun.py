"""`make demo` run again (issue 30): on a finished folder it leaves the report and figures as they were and
says what it skipped; a record that is missing or unreadable is redone, said in one line. The kill at every
stage boundary is in test_demo_kill.py."""

from __future__ import annotations

import re

import pytest

from olmo_repo.experiments.demo.corpus import BATCH, SEQ_LEN
from olmo_repo.metrics import METRICS_FILE, read_metrics

from .demo_runs import STAGES, TRAINING, copy, headings, outputs, run_demo, skipped

pytestmark = pytest.mark.slow


def test_a_finished_demo_has_every_section(finished_demo):
    for heading in ["## Training", "## In-loop NIAH during stage 2", "## Needle in a haystack", "## Attention mass",
                    "## Learned positions: RePo", "## Training cost"]:  # fmt: skip
        assert heading in headings(finished_demo)
    for split in ("stage1", "stage2"):  # `--steps 2 2`: the corpus holds the windows the steps read, no more
        assert (finished_demo / f"data/{split}.npy").stat().st_size == 2 * BATCH * SEQ_LEN * 4  # uint32
    assert "| model | 512 | 1024 (YaRN x2) |\n" in (finished_demo / "report.md").read_text()  # its --lengths
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (finished_demo / "report.md").read_text())
    assert sorted(links) == sorted(f"figures/{p.name}" for p in (finished_demo / "figures").iterdir())
    for (
        run
    ) in TRAINING:  # evaluations before and after the steps, each step's calls merged: one record per step
        assert [r["step"] for r in read_metrics(finished_demo / run / METRICS_FILE)] == [0, 1, 2], run
    # The learning arm: its RePo layers start as RoPE (p = 1) and hand over (p falls by 1/100 a step) while f_phi
    # learns at 10x; the report names it in every table.
    learning = read_metrics(finished_demo / "stage2-repo-learn" / METRICS_FILE)
    assert [r.get("train/positions/index_blend") for r in learning if r["step"]] == [1.0, 0.99]
    assert "RePo, learning" in (finished_demo / "report.md").read_text()


def test_a_rerun_of_a_finished_demo_changes_nothing_and_says_what_it_skipped(finished_demo, tmp_path):
    out = copy(finished_demo, tmp_path)
    before = outputs(out)
    console = run_demo(out, tmp_path / "rerun.log")
    assert outputs(out) == before  # byte for byte, not even rewritten
    assert skipped(console) == STAGES
    assert "olmo_repo.cli.train" not in console and "redoing" not in console
    assert f"Report: {out / 'report.md'} (unchanged)" in console


def test_a_missing_or_unreadable_record_is_redone_in_one_line(finished_demo, tmp_path):
    out = copy(finished_demo, tmp_path)
    before = {name: content for name, (content, _) in outputs(out).items()}
    weights = out / "stage2-repo-hf/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    (out / "figures/niah-in-loop.png").unlink()
    console = run_demo(out, tmp_path / "rerun.log")
    redone = re.findall(
        r"^== (\S+): its recorded results cannot be read \((.*)\); redoing it$", console, re.M
    )
    assert [name for name, _ in redone] == ["curves", "stage2-repo-hf"]
    assert "niah-in-loop.png" in redone[0][1] and str(weights) in redone[1][1]
    assert skipped(console) == [s for s in STAGES if s not in ("curves", "stage2-repo-hf")]
    assert {name: content for name, (content, _) in outputs(out).items()} == before
