"""The tiny demo as the rerun tests run it (`scripts/demo.py` in a subprocess) and what they read of its folder;
`finish` builds conftest's `finished_demo`, one uninterrupted tiny demo per test run, that they copy or compare
with."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DEMO = ROOT / "scripts/demo.py"
KILLED = ROOT / "tests/demo_killed.py"
# The sizes of tests/test_demo.py, one prompt, NIAH at 1x and 2x (YaRN) the training length: 4x would take the
# evaluation's longest generations for no other path.
ARGS = ["--steps", "2", "2", "--procs", "1", "--samples", "1", "--lengths", "512,1024"]
TRAINING = ["stage1-rope", "stage2-rope", "stage2-repo", "stage2-repo-learn", "stage2-nope"]
HF = [f"{name}-hf" for name in TRAINING[1:]]
STAGES = ["base", "corpus", *TRAINING, "curves", *HF, "evaluation"]  # in the order the demo runs them


def run_demo(out: Path, log: Path, kill_after: str | None = None) -> str:
    """Run the demo into `out` (console in `log`) to its end, or, with `kill_after` (a stage, or
    `demo_killed.FIRST_SECTION`), killed by SIGKILL right after that stage finished (`tests/demo_killed.py`).
    Returns the console."""
    script = [str(DEMO)] if kill_after is None else [str(KILLED), kill_after]
    with open(log, "w") as f:
        code = subprocess.run(
            [sys.executable, *script, str(out), *ARGS],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ).returncode
    console = log.read_text()
    assert code == (0 if kill_after is None else -9), console[-3000:]
    return console


def stages(out: Path) -> dict[str, dict]:
    path = out / "stages.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def done(out: Path) -> list[str]:
    return [name for name, record in stages(out).items() if record["done"]]


def outputs(out: Path) -> dict[str, tuple[bytes, int]]:
    """report.md and every figure: their bytes and modification times."""
    files = [out / "report.md", *sorted((out / "figures").iterdir())]
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def timeless(report: str) -> str:
    """The report without what says how long a run took: the training table's tokens/s and wall s."""
    header = re.search(r"^\| run \|.*\|$", report, re.M)[0].split(" | ")
    drop = {header.index("tokens/s"), header.index("wall s")}
    rows = re.findall(r"^\| stage\d-[\w-]+ \|.*\|$", report, re.M)
    for row in rows:
        cells = row.split(" | ")
        report = report.replace(row, " | ".join("-" if i in drop else c for i, c in enumerate(cells)))
    return report


def headings(out: Path) -> list[str]:
    report = out / "report.md"
    return re.findall(r"^#+ .*$", report.read_text(), re.M) if report.is_file() else []


def skipped(console: str) -> list[str]:
    return re.findall(r"^== (\S+): finished before with the same inputs, skipped$", console, re.M)


def copy(demo: Path, tmp_path: Path) -> Path:
    """A copy of a demo folder elsewhere (times kept): the demo's records do not name its folder."""
    out = tmp_path / "demo"
    shutil.copytree(demo, out, symlinks=True)
    return out


def finish(folder: Path) -> None:
    """An uninterrupted tiny demo in `folder`/demo (its console in `folder`/console.log)."""
    folder.mkdir()
    run_demo(folder / "demo", folder / "console.log")
