"""`rotate` for the HF modeling file's `from .rope import rotate`: inside the package it is `olmo_repo.rope`'s;
in a converted checkpoint this module is replaced by a copy of `olmo_repo/rope.py` (torch-only)."""

from ..rope import rotate

__all__ = ["rotate"]
