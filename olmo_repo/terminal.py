"""The terminal is for people: losing it ends the printing, never the work.

A command's standard output and error may die under it: `| head` closes the pipe (EPIPE), a `| tee` or a SLURM
log fills its disk (ENOSPC), an SSH session ends (EIO). Python turns such a write into an `OSError` wherever it
happens (a progress bar, a log line, `print`), which would stop the command before its results are written, or
have it report a failure after they were; and logging prints `--- Logging error ---` for every later line.

`keep_working_without_terminal()` (what `olmo_repo.cli.command` does first in every command's process, each
torchrun worker included) puts `QuietStream`s in place of `sys.stdout` and `sys.stderr`, and in the logging
handlers that already write to them. The first write or flush that fails points the stream's file descriptor at
the null device, so that whatever else writes there (C code, child processes started later, buffered bytes)
goes quiet too, and from then on the stream takes every write without a word; logging stops reporting its own
errors. The work goes on, and the exit status says whether it was done.

A command whose product is what it prints (`flops.py`'s table, a `--dry-run`'s plan) calls `check_printed` once
it has printed it: there a lost standard output is a failure, said on standard error.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from .errors import RepoError

__all__ = ["QuietStream", "check_printed", "keep_working_without_terminal"]


class QuietStream:
    """A text stream (`stream`) that goes quiet on its first failed write or flush: its file descriptor then points
    at the null device, and every later write is taken and dropped. Anything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self.stream.write(text)
            except (OSError, ValueError):  # ValueError: the stream was closed
                self._go_quiet()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._go_quiet()

    def _go_quiet(self) -> None:
        self.lost = True
        logging.raiseExceptions = False  # a handler's failed write would print a report of it to stderr
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError, AttributeError):  # closed, or no descriptor (an in-memory stream)
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        try:  # what the stream still holds goes to the null device now, so a later flush cannot fail on it
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def keep_working_without_terminal() -> None:
    """`sys.stdout` and `sys.stderr` as `QuietStream`s (once), and every logging handler that writes to either
    (they keep the stream they were made with) pointed at its `QuietStream`."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, QuietStream):
            continue
        quiet = QuietStream(stream)
        setattr(sys, name, quiet)
        for handler in _handlers():
            if getattr(handler, "stream", None) is stream:
                handler.setStream(quiet)  # type: ignore[attr-defined]


def _handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [h for logger in loggers if isinstance(logger, logging.Logger) for h in logger.handlers]


def check_printed(what: str) -> None:
    """For a command whose product is what it prints: `RepoError` if standard output was lost before `what` was
    whole (written out to the end: flushed here)."""
    sys.stdout.flush()
    if isinstance(sys.stdout, QuietStream) and sys.stdout.lost:
        raise RepoError(f"standard output was closed before {what} was whole")
