"""A command run as `command 2>&1 | head -N` runs it (or `command 2>LOG | head -N`): N lines of its output read,
then the pipe closed under it, as `head` closes it; what a closed SSH session or a SLURM log's full disk does to a
command's terminal too (`olmo_repo.terminal`)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any


def run_to_head(
    command: list[str], lines: int = 1, log: Path | None = None, timeout: float = 600, **popen: Any
) -> tuple[int, list[str]]:
    """The exit status of `command` and the `lines` lines read of its standard output (and error, unless `log`
    takes it), the pipe closed after them while the command runs on."""
    with contextlib.ExitStack() as files:
        err = files.enter_context(open(log, "w")) if log else subprocess.STDOUT
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, **popen)
        assert proc.stdout is not None
        got = [proc.stdout.readline() for _ in range(lines)]
        proc.stdout.close()
        return proc.wait(timeout), got
