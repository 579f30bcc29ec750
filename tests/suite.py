"""How the three test sessions (`.venv`, `.venv-core`, `.venv-vllm`) share two cores: hooks and a fixture helper
that each session's conftest imports.

Each conftest calls `register` from its `pytest_configure`: the hooks below then run once per test, also where
one session loads several of the conftests (the main session loads tests/core's and tests/vllm's too).

`make test` runs the three sessions side by side, each with pytest-xdist (`-n 2`, whole files per worker): six
workers, of which two compute at a time. Then:

- every worker computes with one thread (torch, and through `OMP_NUM_THREADS` the processes it starts) and holds
  one of two core tokens (`CORES` lock files in the folder `OLMO_REPO_SUITE_CORES` names, shared by the
  sessions) during each test, so that two tests run at a time over all sessions instead of six fighting;
- a test marked `procs` (it starts a process group of its own: torchrun, spawned ranks, a SLURM job) holds both
  tokens: it waits for the running tests to finish, and none starts meanwhile (a turnstile lock: fair to it); a
  long test made of several subprocess runs calls `let_procs_in` between them, so a waiting `procs` test goes first;
- `built_once` builds an expensive input (a finished demo, a trained checkpoint) once for the whole run,
  whichever worker asks first, the others waiting for it; a failed build fails every test that asks for it,
  with the first failure's message, without building again;
- files whose tests take longest start first (`FIRST`), so that no worker is left with a long file at the end.

Without xdist (a developer's `pytest tests/test_x.py`) nothing here changes how tests run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under xdist; None otherwise

# Files started first, longest first (their share of a `make test` run: `--durations` of `make test`).
FIRST = [
    "test_demo_rerun.py",
    "test_demo_kill.py",
    "test_inloop_niah.py",
    "test_train_cli.py",
    "test_eval.py",
    "test_demo.py",
    "test_slurm.py",
    "test_train_fsdp.py",
    "test_train.py",
    "test_vllm_serving.py",
    "test_vllm.py",
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


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


CORES = 2  # tests computing at once over every session sharing the folder: the two cores
_HELD: list = []  # (core token file, turnstile) this worker holds during its current one-thread test


def _take_core(folder: Path) -> IO:
    """One of the `CORES` token files, locked; waits (polling: flock cannot wait for either of two) for a free one."""
    while True:
        for i in range(CORES):
            f = open(folder / f"core{i}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return f
            except BlockingIOError:
                f.close()
        time.sleep(0.02)


@contextmanager
def _cores(folder: Path, exclusive: bool) -> Iterator[None]:
    """Hold one core token (a one-thread test) or all of them (a `procs` test). A writer takes the turnstile before
    waiting for the tokens, so a reader that comes after it waits too instead of starving it."""
    folder.mkdir(parents=True, exist_ok=True)
    turnstile = folder / "turnstile.lock"
    if exclusive:
        with _flock(turnstile, fcntl.LOCK_EX), ExitStack() as stack:
            for i in range(CORES):
                stack.enter_context(_flock(folder / f"core{i}.lock", fcntl.LOCK_EX))
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        pass
    _HELD.append([_take_core(folder), turnstile])
    try:
        yield
    finally:
        _HELD.pop()[0].close()  # closing the file drops its lock


def let_procs_in() -> None:
    """Between the steps of a long test (its subprocess runs): if a `procs` test waits for the cores, let it run
    first, then go on. Without xdist, or with none waiting, returns at once."""
    if not _HELD:
        return
    held = _HELD[0]
    with open(held[1], "a") as t:
        try:
            fcntl.flock(t, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: no writer waits
        except BlockingIOError:
            held[0].close()  # the waiting writer takes the cores now
            fcntl.flock(t, fcntl.LOCK_EX)  # held by the writer until its test ends
            held[0] = _take_core(held[1].parent)
        fcntl.flock(t, fcntl.LOCK_UN)


def _cores_folder(config: pytest.Config) -> Path:
    """`OLMO_REPO_SUITE_CORES` where `make test` runs its sessions side by side (one folder for all of them),
    otherwise this session's own."""
    folder = os.environ.get("OLMO_REPO_SUITE_CORES")
    return Path(folder) if folder else _shared_dir(config._tmp_path_factory)  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test, its fixtures' set-up and tear-down included, under the cores lock (xdist only)."""
    if WORKER is None:
        return (yield)
    with _cores(_cores_folder(item.config), exclusive=item.get_closest_marker("procs") is not None):
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
