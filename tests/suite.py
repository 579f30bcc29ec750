"""How the three test sessions (`.venv`, `.venv-core`, `.venv-vllm`) share two cores: hooks and a fixture helper
that each session's conftest imports.

Each conftest calls `register` from its `pytest_configure`: the hooks below then run once per session, also where
one session loads several of the conftests (the main session loads tests/core's and tests/vllm's too).

`make test` runs the three sessions side by side with pytest-xdist (whole files per worker: three workers for the
main session, two for each of the others, each session starting when its environment is built). Then:

- every worker computes with one thread (torch, and through `OMP_NUM_THREADS` the processes it starts), and the
  kernel shares the two cores among all of them: no test waits for another, a two-process run included, so that
  no core idles while any test has work left (measured against schedules that held such runs alone: docs/setup.md);
- `built_once` builds an expensive input (a finished demo, a trained checkpoint) once for the whole run,
  whichever worker asks first, the others waiting for it; a failed build fails every test that asks for it,
  with the first failure's message, without building again;
- files whose tests take longest start first (`FIRST`), so that no worker is left with a long file at the end;
- what collection imported is frozen out of the garbage collector's reach (`pytest_collection_finish`).

Without xdist (a developer's `pytest tests/test_x.py`) only the last changes how tests run.
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

# Files started first, longest first (by the `--durations` of `make test` and `make test-long`).
FIRST = [
    "test_smollm2_recipe.py",  # `make test-long`'s longest (5-9 min), the demo killed at every stage next
    "test_demo_kill.py",
    "test_demo_rerun.py",  # the finished demo, ~100 s on a quiet machine
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


def pytest_collection_finish() -> None:
    """Freeze what collection left alive (the modules of every test file, about a million objects that never
    become garbage) out of the collector's reach, as the training commands do (`olmo_repo.cli.freeze_imported`):
    the full collections that the trainers and vLLM's cleanup run in the tests then scan only what a test made
    (measured on four in-process test files: 57 s without, 36 s with). Unfrozen at exit, so that Triton's
    extension finds nothing alive at its teardown."""
    from olmo_repo.cli import freeze_imported

    freeze_imported()


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
