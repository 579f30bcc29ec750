"""tests/suite.py under pytest-xdist, in a pytest run of its own on two workers: a `built_once` input is built
once for the whole run, a failed build fails every test that asks for it without building again, the files
of `FIRST` start first, and the workers compute with one thread. And the project's pytest settings free a passed
test's disk at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow  # a pytest run on two workers of its own

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
from tests.suite import built_once

LOG = os.environ["SUITE_LOG"]

def _log(**record):
    with open(LOG, "a") as f:
        f.write(json.dumps(record) + "\\n")

@pytest.fixture(autouse=True)
def interval(request):
    start = time.monotonic()
    yield
    _log(test=request.node.name, start=start, end=time.monotonic(), threads=torch.get_num_threads(),
         omp=os.environ.get("OMP_NUM_THREADS"), worker=os.environ["PYTEST_XDIST_WORKER"])

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


def _file(name: str) -> str:
    tests = [
        f"def test_{name}_{i}(shared):\n    time.sleep(0.3)\n    assert (shared / 'value').read_text() == '42'\n"
        for i in range(4)
    ]
    tests.append(f"def test_{name}_broken(broken):\n    pass\n")
    return TESTS + "\n\n" + "\n\n".join(tests)


def test_built_once_first_files_and_one_thread_under_two_workers(tmp_path):
    (tmp_path / "conftest.py").write_text(
        CONFTEST + "\nimport tests.suite\ntests.suite.FIRST[:] = ['test_c.py']\n"
    )
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text(_file(name))
    log = tmp_path / "log.jsonl"
    outer = ("PYTEST_XDIST_WORKER", "OMP_NUM_THREADS")  # this run's, not the inner one's
    env = {**{k: v for k, v in os.environ.items() if k not in outer}, "SUITE_LOG": str(log)}
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collected = subprocess.run(
        [*pytest, "--collect-only", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.splitlines()
    assert collected[0].startswith("test_c.py::") and collected[5].startswith("test_a.py::"), collected
    result = subprocess.run(
        [*pytest, "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "--basetemp", str(tmp_path / "tmp"),
         str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    records = [json.loads(line) for line in log.read_text().splitlines()]
    builds = [Path(r["built"]).name for r in records if "built" in r]
    assert sorted(builds) == ["broken", "shared"], builds  # each once, though every test asked
    summary = [line for line in result.stdout.splitlines() if line.startswith("ERROR test_")]
    assert len(summary) == 3 and "12 passed" in result.stdout, result.stdout[-3000:]  # a fixture error each
    assert sum("RuntimeError: the build broke" in line for line in summary) == 1, summary
    assert sum("building broken failed in another test" in line for line in summary) == 2, summary
    tests = [r for r in records if "test" in r]
    assert {r["test"][5] for r in tests} == {"a", "b", "c"} and len(tests) == 15
    assert all(r["threads"] == 1 and r["omp"] == "1" for r in tests)
    assert {r["worker"] for r in tests} == {"gw0", "gw1"}


def test_the_projects_pytest_settings_delete_a_passed_tests_tmp_path_and_keep_a_failed_ones(tmp_path):
    """CI's disk is shared: what a passed test wrote is gone at its teardown, not at the end of the run."""
    (tmp_path / "test_disk.py").write_text(
        "def test_passes(tmp_path):\n    (tmp_path / 'kept').write_text('x')\n\n"
        "def test_fails(tmp_path):\n    (tmp_path / 'kept').write_text('x')\n    assert False\n"
    )
    base = tmp_path / "base"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "--basetemp", str(base), str(tmp_path / "test_disk.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "1 failed, 1 passed" in result.stdout, result.stdout[-2000:]
    assert sorted(p.parent.name for p in base.rglob("kept")) == ["test_fails0"]
