"""CPython (3.10-3.13): the steps of the interpreter's own exit that a finished command keeps.

A process that returns from its main code ends in `Py_FinalizeEx`: it joins its non-daemon threads
(`threading._shutdown`, which first runs what `threading._register_atexit` holds, e.g. concurrent.futures'
executors), calls the `atexit` handlers (logging's flush and close, wandb's, multiprocessing's, weakref
finalizers, `olmo_repo.cli.freeze_imported`'s unfreeze), flushes the standard streams, and then tears every
module down, with several full garbage collections over every object still alive. In a process that imported a
trainer (about a million objects) that last part costs ~2 s of CPU and changes nothing a user sees: a 2-step tiny
ai2-olmo run took 8.7 CPU-s with it, 6.5 without.

`exit_without_teardown(status)` does the first three, in that order (C's stdio buffers flushed too), and ends
the process with `os._exit(status)`. The two private functions it calls are CPython's, the same in 3.10 to
3.13: `CANARIES` requires them, and tests/test_scripts.py checks the steps they stand for (an executor's and a
thread's last writes, an atexit handler's, Python's and C's buffered output, the status)."""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from typing import NoReturn

__all__ = ["CANARIES", "exit_without_teardown"]


def exit_without_teardown(status: int) -> NoReturn:
    """End this process with `status` as the interpreter would, without its module teardown (see the module's
    docstring). Call it from the main thread, once the command is done."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, a broken pipe, or no stream at all
            pass
    try:  # and what C code printed: `os._exit` leaves C's stdio buffers unwritten
        ctypes.CDLL(None).fflush(None)
    except (OSError, TypeError, AttributeError):  # no C library to open by that name (not Linux or macOS)
        pass
    os._exit(status)


CANARIES: dict[str, str | None] = {  # names that must exist (their behaviour: tests/test_scripts.py)
    "threading._shutdown": None,
    "atexit._run_exitfuncs": None,
}
