"""The commands, one module per script in `scripts/`: each has `main(argv: list[str] | None = None) -> int`.

A command parses its arguments before any heavy import (so `--help` and argument errors answer at once),
then calls the library, and turns the library's errors (`olmo_repo.errors.RepoError`, and the OLMo,
transformers and OS errors a user's input can cause) into one line on stderr with exit status 1. The
scripts are three lines that call `main`.
"""

from __future__ import annotations

import sys

__all__ = ["fail"]


def fail(prog: str, error: BaseException | str) -> int:
    """Print `prog: error: ...` (the first line of the error) on stderr; return the exit status 1."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, KeyError) and message.startswith(("'", '"')):
        message = message[1:-1]  # KeyError quotes its message
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1
