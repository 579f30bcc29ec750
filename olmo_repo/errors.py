"""The project's error: library code raises it (or a subclass), and the commands in `olmo_repo.cli` turn it
into one line on stderr and an exit code. Standard library only."""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches

__all__ = ["CorruptFileError", "RepoError", "not_a_key"]


class RepoError(Exception):
    """A problem with the user's input or environment, said in one line that names the file or key."""


class CorruptFileError(RepoError):
    """A checkpoint or weights file that is missing, truncated or not what its name says."""


def not_a_key(full_key: str, known: Iterable[str], owner: str) -> str:
    """The one line for a config key `full_key` (dotted) whose last part is none of `known`, the keys of
    `owner` (a config class): the nearest one named, or the class. Both trainers' configs and overrides say
    it so."""
    prefix, _, name = full_key.rpartition(".")
    match = get_close_matches(name, list(known), n=1, cutoff=0.6)
    if match:
        return f"{full_key} is not a config key; did you mean {prefix + '.' if prefix else ''}{match[0]}?"
    return f"{full_key} is not a config key (not in '{owner}')"
