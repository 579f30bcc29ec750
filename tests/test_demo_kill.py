"""`make demo` killed at every stage boundary (issue 30): SIGKILL right after each stage records itself finished
(and once in the middle of the evaluation), through `tests/demo_killed.py`, then started again: every start
skips what finished, the evaluation resumes after the section it recorded, the report never loses a section it
had, and the last start leaves the report and figures of an uninterrupted demo (`finished_demo`, built
meanwhile by the other worker under xdist)."""

from __future__ import annotations

import pytest

from .demo_killed import FIRST_SECTION
from .demo_runs import STAGES, done, headings, outputs, run_demo, skipped, timeless

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_a_demo_killed_at_every_stage_boundary_ends_as_an_uninterrupted_one(request, tmp_path):
    out = tmp_path / "demo"
    kills = [*STAGES[:-1], FIRST_SECTION, None]  # None: the last start, to the end
    seen: list[str] = []
    for i, kill_after in enumerate(kills):
        before = done(out)
        console = run_demo(out, tmp_path / f"start{i}.log", kill_after)
        assert skipped(console) == [s for s in STAGES if s in before]  # every finished stage, and only those
        assert "recorded results cannot be read" not in console
        assert set(seen) <= set(headings(out))  # nothing the report had is lost
        seen = headings(out)
        if kill_after in STAGES:
            assert done(out) == STAGES[: STAGES.index(kill_after) + 1]
        if kills[i - 1] == FIRST_SECTION:  # the evaluation resumes after its recorded section
            assert "== evaluation: started before and interrupted, resuming it" in console
            assert "1 section(s) recorded before, kept" in console and "NIAH:" not in console
        if kill_after == "stage1-rope":  # stage 1's run is left as it was by the starts after it
            metrics = out / "stage1-rope/metrics.jsonl"
            stage1 = (metrics.read_bytes(), metrics.stat().st_mtime_ns)
    assert (metrics.read_bytes(), metrics.stat().st_mtime_ns) == stage1
    assert done(out) == STAGES
    finished = request.getfixturevalue(
        "finished_demo"
    )  # asked for last: the other worker builds it meanwhile
    resumed = {name: content for name, (content, _) in outputs(out).items()}
    reference = {name: content for name, (content, _) in outputs(finished).items()}
    assert resumed.keys() == reference.keys()
    assert timeless(resumed.pop("report.md").decode()) == timeless(reference.pop("report.md").decode())
    assert resumed == reference  # the figures, byte for byte
