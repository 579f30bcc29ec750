"""`make demo` run again (issue 30): on a finished folder it leaves the report and figures as they were and
says what it skipped; a record that is missing or unreadable is redone, said in one line; after a kill at every
stage boundary the resumed demo ends with the report and figures of an uninterrupted one. One uninterrupted
tiny demo (the module's fixture) is the reference the others copy or compare with."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow

DEMO = ROOT / "scripts/demo.py"
ARGS = ["--steps", "2", "2", "--procs", "1", "--samples", "1"]  # the sizes of tests/test_demo.py, one prompt
TRAINING = ["stage1-rope", "stage2-rope", "stage2-repo", "stage2-nope"]
HF = [f"{name}-hf" for name in TRAINING[1:]]
STAGES = ["base", "corpus", *TRAINING, "curves", *HF, "evaluation"]  # in the order the demo runs them


def _demo(out: Path, log: Path, until: Callable[[], bool] | None = None) -> str:
    """Run the demo into `out` (console in `log`): to its end, or killed (SIGKILL, with its training
    processes) as soon as `until()` holds. Returns the console."""
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, str(DEMO), str(out), *ARGS],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while until is not None and not until() and proc.poll() is None:
            time.sleep(0.1)
        if until is None:
            assert proc.wait() == 0, log.read_text()[-3000:]
        else:
            assert until(), log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return log.read_text()


def _stages(out: Path) -> dict[str, dict]:
    path = out / "stages.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _done(out: Path) -> list[str]:
    return [name for name, record in _stages(out).items() if record["done"]]


def _outputs(out: Path) -> dict[str, tuple[bytes, int]]:
    """report.md and every figure: their bytes and modification times."""
    files = [out / "report.md", *sorted((out / "figures").iterdir())]
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def _timeless(report: str) -> str:
    """The report without what says how long a run took: the training table's tokens/s and wall s."""
    header = re.search(r"^\| run \|.*\|$", report, re.M)[0].split(" | ")
    drop = {header.index("tokens/s"), header.index("wall s")}
    rows = re.findall(r"^\| stage\d-\w+ \|.*\|$", report, re.M)
    for row in rows:
        cells = row.split(" | ")
        report = report.replace(row, " | ".join("-" if i in drop else c for i, c in enumerate(cells)))
    return report


def _headings(out: Path) -> list[str]:
    report = out / "report.md"
    return re.findall(r"^#+ .*$", report.read_text(), re.M) if report.is_file() else []


def _skipped(console: str) -> list[str]:
    return re.findall(r"^== (\S+): finished before with the same inputs, skipped$", console, re.M)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny demo, run to its end without interruption."""
    out = tmp_path_factory.mktemp("finished") / "demo"
    _demo(out, out.parent / "console.log")
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished demo elsewhere (times kept): the demo's records do not name its folder."""
    out = tmp_path / "demo"
    shutil.copytree(finished, out, symlinks=True)
    return out


def test_a_finished_demo_has_every_section(finished):
    headings = _headings(finished)
    for heading in ["## Training", "## In-loop NIAH during stage 2", "## Needle in a haystack", "## Attention mass",
                    "## Learned positions: RePo", "## Training cost"]:  # fmt: skip
        assert heading in headings
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (finished / "report.md").read_text())
    assert sorted(links) == sorted(f"figures/{p.name}" for p in (finished / "figures").iterdir())


def test_a_rerun_of_a_finished_demo_changes_nothing_and_says_what_it_skipped(finished, tmp_path):
    out = _copy(finished, tmp_path)
    before = _outputs(out)
    console = _demo(out, tmp_path / "rerun.log")
    assert _outputs(out) == before  # byte for byte, not even rewritten
    assert _skipped(console) == STAGES
    assert "olmo_repo.cli.train" not in console and "redoing" not in console
    assert f"Report: {out / 'report.md'} (unchanged)" in console


def test_a_missing_or_unreadable_record_is_redone_in_one_line(finished, tmp_path):
    out = _copy(finished, tmp_path)
    before = {name: content for name, (content, _) in _outputs(out).items()}
    weights = out / "stage2-repo-hf/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    (out / "figures/niah-in-loop.png").unlink()
    console = _demo(out, tmp_path / "rerun.log")
    redone = re.findall(
        r"^== (\S+): its recorded results cannot be read \((.*)\); redoing it$", console, re.M
    )
    assert [name for name, _ in redone] == ["curves", "stage2-repo-hf"]
    assert "niah-in-loop.png" in redone[0][1] and str(weights) in redone[1][1]
    assert _skipped(console) == [s for s in STAGES if s not in ("curves", "stage2-repo-hf")]
    assert {name: content for name, (content, _) in _outputs(out).items()} == before


def test_a_demo_killed_at_every_stage_boundary_ends_as_an_uninterrupted_one(finished, tmp_path):
    """Kill the demo as soon as each stage has finished (and once in the middle of the evaluation, after its
    first section), rerun it each time: every rerun skips what finished, the report never loses a section it
    had, and the last run leaves the report and figures of the uninterrupted demo (timings aside)."""
    out = tmp_path / "demo"

    def mid_evaluation() -> bool:
        record = out / "evaluation.json"
        return record.is_file() and len(json.loads(record.read_text())) > 0

    boundaries = [(name, lambda name=name: name in _done(out)) for name in STAGES[:-1]]
    boundaries.append(("the evaluation's first section", mid_evaluation))
    headings: list[str] = []
    for i, (_, until) in enumerate([*boundaries, (None, None)]):
        if until is not None and until():
            continue  # the previous start got past this boundary before its kill
        done = _done(out)
        console = _demo(out, tmp_path / f"start{i}.log", until)
        assert _skipped(console) == [s for s in STAGES if s in done]  # every finished stage, and only those
        assert "recorded results cannot be read" not in console
        assert set(headings) <= set(_headings(out))  # nothing the report had is lost
        headings = _headings(out)
        if i == 2:  # stage 1's run is left as it was by the starts after it
            metrics = out / "stage1-rope/metrics.jsonl"
            stage1 = (metrics.read_bytes(), metrics.stat().st_mtime_ns)
    assert (metrics.read_bytes(), metrics.stat().st_mtime_ns) == stage1
    assert _done(out) == STAGES
    resumed = {name: content for name, (content, _) in _outputs(out).items()}
    reference = {name: content for name, (content, _) in _outputs(finished).items()}
    assert resumed.keys() == reference.keys()
    assert _timeless(resumed.pop("report.md").decode()) == _timeless(reference.pop("report.md").decode())
    assert resumed == reference  # the figures, byte for byte
