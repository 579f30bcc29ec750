"""A run owns its save folder: its training processes hold a lock on the folder while they live, a second run
on a folder in use is refused in one line naming the live run, and a worker dies with the launcher that started
it. Standard library only: both trainers' runs (ai2-olmo's and OLMo-core's) and their launch checks call it.

The lock is `save_folder/.olmo-repo.lock`, an `fcntl` record lock held by the training processes themselves, not
by their launcher: each rank locks the byte at its global rank, so a launcher killed outright frees nothing while
its workers still write, and the kernel drops a process's locks when it dies, however it dies, so a dead run
never leaves the folder stuck. POSIX record locks are chosen over `flock` because forked children (data-loader
workers) do not inherit them, and because NFS carries them between machines. Rank 0 writes who holds the folder
(pid, host, start) into the file and empties it when the run ends. A remote save folder (a URL) cannot be locked
so: that is said in one line, and the run goes on unguarded.

torchrun starts its workers in sessions of their own: a kill of the launcher's process group does not reach
them, and without their launcher they would train on, racing the rerun. `die_with_launcher` makes a worker
notice its launcher's death itself: a daemon thread polls the parent pid once a second and kills the worker when
it changes (the parent died and the worker was handed to init or a subreaper). `prctl(PR_SET_PDEATHSIG)` would
signal at once, but it is Linux-only, fires on the death of the parent *thread* that forked the worker (not of
the process), and is set by the child after the fork, racing a parent that dies first; the thread costs one
`getppid` a second, works wherever Python does, and checks the launcher's pid as the launcher wrote it
(`LAUNCHER_PID`), so a launcher that died while the worker started is noticed too.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import RepoError
from .paths import is_url

__all__ = ["LAUNCHER_PID", "LOCK_FILE", "check_free", "die_with_launcher", "held"]

log = logging.getLogger(__name__)

LOCK_FILE = ".olmo-repo.lock"
LAUNCHER_PID = "OLMO_REPO_LAUNCHER_PID"
"""The environment variable by which the training commands' launcher tells its workers its pid."""

_POLL_S = 1.0
_watching = threading.Event()


def _in_worker() -> bool:
    """Whether this process is a worker that torchrun started (its peers hold the other ranks' bytes)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def die_with_launcher() -> None:
    """In a worker of torchrun: kill this process when its launcher (its parent) dies, however it dies (see the
    module's docstring). Elsewhere (a one-process run, which may outlive a shell on purpose) nothing. Once per
    process."""
    if not _in_worker() or _watching.is_set():
        return
    _watching.set()
    launcher = int(os.environ.get(LAUNCHER_PID) or os.getppid())

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(_POLL_S)
        print(
            f"training process {os.environ.get('RANK', '?')} (pid {os.getpid()}): its launcher (pid {launcher}) "
            "is gone; stopping",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-launcher", daemon=True).start()


def _holder(fd: int) -> str:
    """Who holds the folder, as its rank 0 wrote it: "pid P on HOST, since T"; "another process" when it has not
    written yet, or what it wrote is stale (a pid of this host that no longer runs)."""
    try:
        who = json.loads(os.pread(fd, 4096, 0) or b"null")
        pid, host, since = int(who["pid"]), str(who["host"]), str(who["since"])
    except (OSError, ValueError, TypeError, KeyError):
        return "another process"
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "another process"
        except PermissionError:
            pass  # alive, another user's
    return f"pid {pid} on {host}, since {since}"


def _in_use(key: str, folder: str, fd: int) -> RepoError:
    return RepoError(
        f"{key}={folder} is in use by a live run ({_holder(fd)}): wait for it to end or stop it, or use another "
        "save folder"
    )


def _cannot_lock(key: str, folder: str, why: str) -> None:
    log.warning(
        "%s=%s %s: no lock keeps a second run out of it; start one run on it at a time", key, folder, why
    )


def _lock(fd: int, start: int, length: int) -> bool:
    """Lock bytes [start, start + length) (length 0: to the end and past it) of `fd` without waiting; False
    when another process holds some of them. Other errors (a file system that takes no locks) propagate."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def check_free(folder: str, key: str) -> None:
    """`RepoError` naming the live run when `folder` is in use (what a launch check and a one-process run check
    before touching the folder). In a torchrun worker, whose peers hold the folder's other bytes, only this
    rank's byte is checked. A folder without a lock file was never held; nothing is created."""
    path = Path(folder, LOCK_FILE)
    if is_url(folder) or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return  # unreadable: the save folder's own checks say what is wrong with it
    try:
        start, length = (int(os.environ.get("RANK", "0")), 1) if _in_worker() else (0, 0)
        if not _lock(fd, start, length):
            raise _in_use(key, folder, fd)
    except OSError as e:
        _cannot_lock(key, folder, f"is on a file system that takes no locks ({e.strerror})")
    finally:
        os.close(fd)  # drops the probe's lock


@contextmanager
def held(folder: str, key: str, rank: int) -> Iterator[None]:
    """Hold `folder` for this training process of global rank `rank` while the block runs (the folder is
    created if missing); `RepoError` naming the live run when another run holds it. A remote folder (a URL) or a
    file system without locks is said so in one line (rank 0) and not held."""
    if is_url(folder):
        if rank == 0:
            _cannot_lock(key, folder, "is remote")
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            locked = _lock(fd, rank, 1)
        except OSError as e:
            if rank == 0:
                _cannot_lock(key, folder, f"is on a file system that takes no locks ({e.strerror})")
            locked = None
        if locked is False:
            raise _in_use(key, folder, fd)
        if locked and rank == 0:
            since = time.strftime("%Y-%m-%d %H:%M:%S")
            who = {"pid": os.getpid(), "host": socket.gethostname(), "since": since}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(who).encode() + b"\n", 0)
        try:
            yield
        finally:
            if locked and rank == 0:
                os.ftruncate(fd, 0)  # the run ended: nobody to name
    finally:
        os.close(fd)  # drops the lock (as the death of the process does)
