"""The fetch's one error type: what went wrong and what to do, in one line (the CLI prints it as is)."""

from ..errors import RepoError

__all__ = ["FetchError"]


class FetchError(RepoError):
    """A problem a user can act on: a missing config, an unreachable server, a bad --to, a full disk."""
