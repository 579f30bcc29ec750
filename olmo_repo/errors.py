"""The project's error: library code raises it (or a subclass), and the commands in `olmo_repo.cli` turn it
into one line on stderr and an exit code. Standard library only."""

from __future__ import annotations

__all__ = ["CorruptFileError", "RepoError"]


class RepoError(Exception):
    """A problem with the user's input or environment, said in one line that names the file or key."""


class CorruptFileError(RepoError):
    """A checkpoint or weights file that is missing, truncated or not what its name says."""
