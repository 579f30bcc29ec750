"""Whether a path a user gives is a URL or a local path: the one test every module applies (standard library only)."""

from __future__ import annotations

import re
from os import PathLike

__all__ = ["is_url"]

_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")  # RFC 3986's scheme, then "://"


def is_url(path: str | PathLike) -> bool:
    """Whether `path` is a URL (s3://, gs://, r2://, http(s)://, file://, ...), not a local path."""
    return _SCHEME.match(str(path)) is not None
