"""A run owns its save folder (`olmo_repo.ownership`): a folder held by a live process is refused in one line
naming it, and freed when that process dies, however it dies; a worker started by torchrun dies with its
launcher however the launcher is stopped (SIGKILL of it or of its process group, SIGTERM, Ctrl-C), and the
folder is free again. Each trainer's own run is killed for real in tests/test_train_cli.py and
tests/core/test_train.py."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from olmo_repo.errors import RepoError
from olmo_repo.ownership import LOCK_FILE, check_free, held

ROOT = Path(__file__).resolve().parents[1]
HOLD = "import sys, time; from olmo_repo.ownership import held\nwith held(sys.argv[1], 'save_folder', int(sys.argv[2])):\n    print('held', flush=True); time.sleep(600)"


def _holding(folder: Path, rank: int = 0) -> subprocess.Popen:
    """A process that holds `folder` at `rank` until killed (started once it holds)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(rank)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_held_folder_is_refused_naming_its_holder_and_freed_by_its_death(tmp_path):
    run = tmp_path / "run"
    holder = _holding(run)
    try:
        with pytest.raises(RepoError) as refused:
            check_free(str(run), "save_folder")
        message = str(refused.value)
        assert message.startswith(f"save_folder={run} is in use by a live run (pid {holder.pid} on ")
        assert socket.gethostname() in message and "\n" not in message
        with pytest.raises(RepoError, match=f"pid {holder.pid} on"):  # a second run's process
            with held(str(run), "save_folder", 0):
                pass
    finally:
        holder.kill()
        holder.wait()
    check_free(str(run), "save_folder")  # its death freed it: nothing to clean up
    with held(str(run), "save_folder", 0):
        assert str(os.getpid()) in (run / LOCK_FILE).read_text()
    assert (run / LOCK_FILE).read_text() == ""  # a run that ended names nobody


def test_each_rank_holds_its_own_byte(tmp_path):
    """The ranks of one run hold the folder side by side; a second run's rank that one of them holds is
    refused, and so is a launch check while any rank lives (rank 0 has named nobody here)."""
    run = tmp_path / "run"
    holder = _holding(run, rank=1)
    try:
        with held(str(run), "save_folder", 0):  # rank 0 of the same run
            pass
        with pytest.raises(RepoError, match="in use by a live run \\(another process\\)"):
            with held(str(run), "save_folder", 1):
                pass
        with pytest.raises(RepoError, match="in use by a live run"):
            check_free(str(run), "save_folder")
    finally:
        holder.kill()
        holder.wait()


def test_a_remote_save_folder_is_said_unguarded_in_one_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING), held("s3://bucket/runs/a", "--save-folder", 0):
        pass
    (record,) = caplog.records
    assert record.getMessage() == (
        "--save-folder=s3://bucket/runs/a is remote: no lock keeps a second run out of it; start one run on it "
        "at a time"
    )
    check_free("s3://bucket/runs/a", "--save-folder")  # nothing to check, nothing created


LAUNCHER = "from olmo_repo.cli.launch import _torchrun; raise SystemExit(_torchrun('train.py', 'tests.ownership_worker', 2, [{folder!r}]))"


def _holders(log: Path) -> set[int]:
    return {int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("holding ")}


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGKILL group", "SIGKILL launcher", "SIGTERM", "Ctrl-C"])
def test_workers_die_with_their_launcher_however_it_is_stopped(tmp_path, stop):
    """The launcher of the training commands (`olmo_repo.cli.launch`: torchrun in-process) with two workers that
    hold the folder as the trainers' do (`tests/ownership_worker.py`): stopped each way, the workers die within
    seconds and free the folder."""
    run, log = tmp_path / "run", tmp_path / "launcher.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(folder=str(run))], env=env, cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while len(_holders(log)) < 2 and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = psutil.Process(launcher.pid).children()
    try:
        assert {w.pid for w in workers} == _holders(log) and len(workers) == 2, log.read_text()
        with pytest.raises(RepoError):  # what the launch check of a second run says
            check_free(str(run), "save_folder")
        if stop == "SIGKILL group":
            os.killpg(launcher.pid, signal.SIGKILL)
        elif stop == "SIGKILL launcher":
            launcher.kill()
        elif stop == "SIGTERM":
            launcher.terminate()
        else:  # what a terminal sends its foreground process group
            os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == [], log.read_text()
    finally:
        for worker in workers:  # a failed test leaves nothing running
            if worker.is_running():
                worker.kill()
    check_free(str(run), "save_folder")
    if stop.startswith("SIGKILL"):  # they noticed it themselves
        assert log.read_text().count("is gone; stopping") == 2, log.read_text()
