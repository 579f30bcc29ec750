"""How the three test sessions (`.venv`, `.venv-core`, `.venv-vllm`) share two cores: hooks and a fixture helper
that each session's conftest imports.

Each conftest calls `register` from its `pytest_configure`: the hooks below then run once per test, also where
one session loads several of the conftests (the main session loads tests/core's and tests/vllm's too).

`make test` runs every session with pytest-xdist (`-n 2`, whole files per worker). Then:

- every worker computes with one thread (torch, and through `OMP_NUM_THREADS` the processes it starts), so the
  two workers share the two cores instead of fighting over them;
- a test marked `procs` (it starts processes that compute at the same time: torchrun ranks, a SLURM job) runs
  alone: the other worker finishes its current test and waits (a fair reader-writer lock on two files); a long
  test made of several subprocess runs calls `let_procs_in` between them, so a waiting `procs` test goes first;
- `built_once` builds an expensive input (a finished demo, a trained checkpoint) once for the whole run,
  whichever worker asks first, the others waiting for it; a failed build fails every test that asks for it,
  with the first failure's message, without building again;
- files whose tests take longest start first (`FIRST`), so that no worker is left with a long file at the end;
- sessions that run at the same time (`make test` runs the vLLM and OLMo-core sessions side by side, two workers
  each) share the cores lock through `OLMO_REPO_SUITE_CORES`, so that a `procs` test runs alone across them.

Without xdist (a developer's `pytest tests/test_x.py`) nothing here changes how tests run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under xdist; None otherwise
CORES_DIR = (
    "OLMO_REPO_SUITE_CORES"  # a folder for the cores lock shared by sessions that run at the same time
)

# Files started first, longest first (by the `--durations` of `make test` and `make test-long`).
FIRST = [
    "test_smollm2_recipe.py",  # `make test-long`'s longest (5-9 min), the demo killed at every stage next
    "test_demo_kill.py",
    "test_demo_rerun.py",  # the finished demo, ~100 s: the other worker meanwhile runs files without `procs` tests
    "test_inloop_niah.py",
    "test_eval.py",
    "test_train_cli.py",
    "test_train_fsdp.py",
    "test_bench.py",
    "test_train.py",  # the OLMo-core session's longest, then its two-process ones
    "test_parity_olmo.py",
    "test_smollm2_core.py",
    "test_vllm.py",  # the vLLM session's longest
    "test_vllm_serving.py",
]

if WORKER is not None:
    os.environ["OMP_NUM_THREADS"] = "1"  # read by torch at import, and by every process a test starts
    import torch

    torch.set_num_threads(1)


def register(config: pytest.Config) -> None:
    """Register this module's hooks with `config`, once."""
    plugin = sys.modules[__name__]
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "olmo-repo-suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of `FIRST` first, in its order; the others after them as collected (a stable sort)."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run sees: the parent of the workers' own base temporary folders."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if WORKER is not None else base


def _cores_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the cores lock lives: `CORES_DIR` when set (sessions run side by side, as `make test` runs the vLLM
    and OLMo-core ones, share one lock), else the session's shared folder."""
    return Path(os.environ.get(CORES_DIR) or _shared_dir(tmp_path_factory))


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_HELD: list = []  # the cores lock file this worker holds shared during its current test (one at most)


@contextmanager
def _cores(folder: Path, exclusive: bool) -> Iterator[None]:
    """Hold the cores shared (a one-thread test) or alone (a `procs` test). A writer takes the turnstile before
    waiting for the cores, so a reader that comes after it waits too instead of starving it."""
    turnstile, cores = folder / "turnstile.lock", folder / "cores.lock"
    if exclusive:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(cores, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        pass
    with open(cores, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        _HELD.append((f, turnstile))
        try:
            yield
        finally:
            _HELD.clear()
            fcntl.flock(f, fcntl.LOCK_UN)


def let_procs_in() -> None:
    """Between the steps of a long test (its subprocess runs): if a `procs` test waits for the cores, let it run
    first, then go on. Without xdist, or with none waiting, returns at once."""
    if not _HELD:
        return
    f, turnstile = _HELD[0]
    with open(turnstile, "a") as t:
        try:
            fcntl.flock(t, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: no writer waits
        except BlockingIOError:
            fcntl.flock(f, fcntl.LOCK_UN)  # the waiting writer takes the cores now
            fcntl.flock(t, fcntl.LOCK_EX)  # held by the writer until its test ends
            fcntl.flock(f, fcntl.LOCK_SH)
        fcntl.flock(t, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test, its fixtures' set-up and tear-down included, under the cores lock (xdist only)."""
    if WORKER is None:
        return (yield)
    shared = _cores_dir(item.config._tmp_path_factory)  # type: ignore[attr-defined]  (pytest's own)
    with _cores(shared, exclusive=item.get_closest_marker("procs") is not None):
        return (yield)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name` that `build(folder)` fills, built once for the whole test run (every xdist worker
    gets the same folder; the first to ask builds it while the others wait). Tests that change what is in it
    work on a copy. A build that fails fails every test asking for it, with the first failure's message."""
    root = _shared_dir(tmp_path_factory)
    folder, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with _flock(root / f"{name}.lock", fcntl.LOCK_EX):
        if failed.is_file():
            pytest.fail(f"building {name} failed in another test:\n{failed.read_text()}", pytrace=False)
        if not done.is_file():
            if folder.exists():
                shutil.rmtree(folder)
            try:
                build(folder)
            except BaseException:
                failed.write_text(traceback.format_exc())
                raise
            done.touch()
    return folder
