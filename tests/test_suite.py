"""tests/suite.py under pytest-xdist, in two pytest runs of two workers each, side by side as in `make test`: at
most two tests compute at a time over both, a `procs` test overlaps no other test (a long test lets it in between
its steps), a `built_once` input is built once per run, a failed build fails every test that asks for it without
building again, and the workers compute with one thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.procs]  # pytest runs of their own

CONFTEST = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import pytest
from tests.suite import register

def pytest_configure(config):
    register(config)
"""

TESTS = """
import json, os, time
import pytest
import torch
from tests.suite import built_once, let_procs_in

LOG = os.environ["SUITE_LOG"]

def _log(**record):
    with open(LOG, "a") as f:
        f.write(json.dumps(record) + "\\n")

@pytest.fixture(autouse=True)
def interval(request):
    start = time.monotonic()
    yield
    _log(test=request.node.name, procs=request.node.get_closest_marker("procs") is not None,
         start=start, end=time.monotonic(), threads=torch.get_num_threads(), omp=os.environ.get("OMP_NUM_THREADS"),
         worker=os.environ["PYTEST_XDIST_WORKER"])

def _build(folder):
    _log(built=str(folder))
    time.sleep(1)
    folder.mkdir()
    (folder / "value").write_text("42")

def _broken(folder):
    _log(built=str(folder))
    raise RuntimeError("the build broke")

@pytest.fixture
def shared(tmp_path_factory):
    return built_once(tmp_path_factory, "shared", _build)

@pytest.fixture
def broken(tmp_path_factory):
    return built_once(tmp_path_factory, "broken", _broken)
"""


LONG = """
def test_a_long():  # first on its worker: steps until a procs test of the other worker went in a pause
    for step in range(300):  # at most a minute, however late the other worker starts
        start = time.monotonic()
        time.sleep(0.2)
        _log(step=step, start=start, end=time.monotonic())
        let_procs_in()
        with open(LOG) as f:
            if step >= 3 and any('"procs": true' in line for line in f):
                break
"""


def _file(name: str) -> str:
    tests = [LONG] if name == "a" else []
    tests += [
        f"def test_{name}_{i}(shared):\n    time.sleep(0.3)\n    assert (shared / 'value').read_text() == '42'\n"
        for i in range(4)
    ]
    tests.append(f"@pytest.mark.procs\ndef test_{name}_procs():\n    time.sleep(0.6)\n")
    tests.append(f"def test_{name}_broken(broken):\n    pass\n")
    return TESTS + "\n\n" + "\n\n".join(tests)


def _session(folder: Path, names: str, env: dict[str, str]) -> subprocess.Popen:
    """A pytest run on two workers over the files `test_{name}.py`, in `folder`."""
    folder.mkdir()
    (folder / "conftest.py").write_text(CONFTEST)
    for name in names:
        (folder / f"test_{name}.py").write_text(_file(name))
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
         "--no-loadscope-reorder", "--basetemp", str(folder / "tmp"), str(folder)],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _most_at_once(intervals: list[dict]) -> int:
    """The largest number of the (start, end) intervals that overlap at one moment."""
    events = sorted([(r["start"], 1) for r in intervals] + [(r["end"], -1) for r in intervals])
    running = most = 0
    for _, change in events:  # an end sorts before a start at the same moment
        running += change
        most = max(most, running)
    return most


def test_two_sessions_side_by_side_share_two_cores(tmp_path):
    """Two pytest runs of two workers each, sharing one cores folder as `make test`'s three sessions do."""
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "OMP_NUM_THREADS")}
    env.update(SUITE_LOG=str(log), OLMO_REPO_SUITE_CORES=str(tmp_path / "cores"))
    sessions = [_session(tmp_path / "one", "ab", env), _session(tmp_path / "two", "cd", env)]
    outputs = [s.communicate(timeout=600)[0] for s in sessions]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    builds = sorted(
        str(Path(r["built"]).relative_to(tmp_path)).split("/")[::2] for r in records if "built" in r
    )
    # each once per session, though four tests of each session asked
    assert builds == [["one", "broken"], ["one", "shared"], ["two", "broken"], ["two", "shared"]], builds
    for output, passed in zip(outputs, ("11 passed", "10 passed")):
        summary = [line for line in output.splitlines() if line.startswith("ERROR ")]
        assert len(summary) == 2 and passed in output, output[-3000:]  # a fixture error per file
        assert sum("RuntimeError: the build broke" in line for line in summary) == 1, summary
        assert sum("building broken failed in another test" in line for line in summary) == 1, summary
    tests = [r for r in records if "test" in r]
    assert {r["test"][5] for r in tests} == set("abcd") and len(tests) == 25
    assert all(r["threads"] == 1 and r["omp"] == "1" for r in tests)
    long = next(r for r in tests if r["test"] == "test_a_long")
    steps = [r for r in records if "step" in r]
    computing = [r for r in [*tests, *steps] if r is not long]  # the long test's steps count, not its pauses
    assert _most_at_once(computing) <= 2  # two cores over both sessions' four workers
    for alone in (r for r in tests if r["procs"]):
        overlapping = [
            r.get("test", f"step {r.get('step')}")
            for r in computing
            if r is not alone and r["start"] < alone["end"] and alone["start"] < r["end"]
        ]
        assert not overlapping, (alone["test"], overlapping)
    procs = [r for r in tests if r["procs"]]
    assert any(long["start"] < r["start"] < long["end"] for r in procs), (long, procs)  # let in, not held off
