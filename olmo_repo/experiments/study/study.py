"""The study's command: its parts as resumable stages of one folder, and its report.

1. smollm2   the SmolLM2 recipe with the study's arms (`smollm2.options.STUDY_ARMS`), in `smollm2/` (the recipe's own
             stages: a rerun resumes it where it stopped)
2. scratch   the from-scratch arms (`task.ARMS`: RePo, its matched control, RoPE, NoPE, RePo's knobs), each on its
             share of the seeds (`scratch.run_scratch`: two models at a time)

`report.md` gathers both, with when, where and on what load each part ran: the study's figures are
measurements of one machine, and a figure without its conditions is not one.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..smollm2.options import STUDY_ARMS, Recipe
from ..smollm2.recipe import run_recipe
from ..stages import Stages
from .scratch import (
    CURVES,
    FIGURE,
    TEST_SEQUENCES,
    learned_counts,
    loss_curves,
    run_scratch,
    scratch_results,
    scratch_section,
)
from .task import TinyModel

__all__ = ["PARTS", "Study", "run_study"]


@dataclass(frozen=True)
class Study:
    """The study's options (the defaults are docs/research.md's): the recipe it runs with the study's arms, and
    the from-scratch models and their seeds (`seeds` for RePo and its matched control; each arm takes its share,
    `task.Arm.seeds`)."""

    recipe: Recipe = Recipe(lengths=(1024, 2048), arms=STUDY_ARMS)
    seeds: int = 20
    sequences: int = TEST_SEQUENCES
    """Test sequences per model and test (8 queries each)."""
    scratch: TinyModel = field(default_factory=TinyModel)

    def options(self) -> dict[str, object]:
        """The options the report states (the recipe's that the study sets, and the seeds)."""
        r = self.recipe
        return {"steps": r.steps, "samples": r.samples, "lengths": list(r.lengths), "seeds": self.seeds,
                "procs": r.procs, "model": r.model}  # fmt: skip


PARTS = ("smollm2", "scratch")


def run_study(out: Path, study: Study = Study(), parts: tuple[str, ...] = PARTS) -> Path:
    """Run (or resume) the study's `parts` into `out`; returns its report.md (which shows every part done so
    far, and "(to come)" for the others)."""
    folder = Stages(out, "study", "its tiny models, SmolLM2 runs and report")
    conditions = _Conditions(folder)
    if "smollm2" in parts:
        with conditions.part("smollm2", folder.entry("smollm2")):
            run_recipe(folder.path / "smollm2", study.recipe)
        _report(folder, study, conditions)
    if "scratch" in parts:
        with conditions.part("scratch", folder.path):
            run_scratch(folder, study.scratch, study.seeds, sequences=study.sequences,
                        after=lambda: _report(folder, study, conditions))  # fmt: skip
    report = _report(folder, study, conditions)
    print(f"\nstudy report: {report}")
    return report


class _Conditions:
    """When, on what commit and machine load each part ran (the load averages at its start and end: the
    machine may be shared), recorded in the folder's stages as `conditions-{part}`."""

    def __init__(self, folder: Stages):
        self.folder = folder

    def part(self, name: str, where: Path) -> _Part:
        """A context for part `name`, whose stages `where/stages.json` records: its conditions are recorded
        when it ran anything (a rerun that skips every stage keeps those of the run that did the work)."""
        return _Part(self, name, where / Stages.STAGES)

    def record(self, name: str) -> dict | None:
        return self.folder.record(f"conditions-{name}")

    def text(self) -> str:
        rows = []
        for name in ("scratch", "smollm2"):
            if (r := self.record(name)) and r.get("done"):
                rows.append(
                    f"- {name}: {r['started']} to {r['ended']} ({r['wall_min']:.0f} min this time), commit "
                    f"{r['commit']}, load average {r['load_start']} at the start and {r['load_end']} at the end "
                    f"({r['machine']})"
                )
        return "\n".join(rows)


class _Part:
    def __init__(self, conditions: _Conditions, name: str, stages: Path):
        self.conditions, self.name, self.stages = conditions, name, stages

    def _stages(self) -> bytes:
        return self.stages.read_bytes() if self.stages.is_file() else b""

    def __enter__(self) -> None:
        self.start, self.before = time.monotonic(), self._stages()
        self.facts = {"started": time.strftime("%Y-%m-%d %H:%M"), "load_start": _load(), "commit": _commit(),
                      "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.python_version()}"}  # fmt: skip

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None or self._stages() == self.before:  # failed, or nothing ran: keep what was
            return
        stage = f"conditions-{self.name}"
        self.conditions.folder.redo(stage, "", [])
        self.conditions.folder.finish(stage, **self.facts, ended=time.strftime("%Y-%m-%d %H:%M"),
                                      load_end=_load(), wall_min=(time.monotonic() - self.start) / 60)  # fmt: skip


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())  # 1, 5, 15 min


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    return (done.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


def _report(folder: Stages, study: Study, conditions: _Conditions) -> Path:
    smollm2 = folder.path / "smollm2" / "report.md"
    results = scratch_results(folder, study.scratch, study.seeds, study.sequences, partial=True)
    if results:
        from ...eval.plots import plot_learned_shares, plot_loss_panels

        plot_learned_shares(learned_counts(results, study.seeds), folder.entry(FIGURE),
                            title=f"from scratch: models that learned the recall ({len(results)} models)")  # fmt: skip
        curves, learned = loss_curves(results, study.scratch, study.seeds)
        if curves:
            guess = math.log(study.scratch.task.pairs)
            plot_loss_panels(curves, folder.entry(CURVES), marked=learned, reference=(guess, "guessing among the values"),
                             ylabel="answers' training loss", title="from scratch, each model (blue: learned)")  # fmt: skip
    parts = [
        "# Learning positions on one machine: the study\n",
        "Options: " + json.dumps(study.options()) + "\n",
        "## Where and when\n\n" + conditions.text() + "\n",
        "## SmolLM2-135M continued: the arms\n\n"
        + ("In [smollm2/report.md](smollm2/report.md).\n" if smollm2.is_file() else "(to come)\n"),
        scratch_section(results, study.scratch, study.seeds, study.sequences)
        if results
        else "## From scratch\n\n(to come)\n",
    ]
    folder.write_text("report.md", "\n".join(parts))
    return folder.path / "report.md"
