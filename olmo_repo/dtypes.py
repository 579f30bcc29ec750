"""The dtypes a model is converted to, loaded or evaluated in, by name. Standard library only: the commands'
parsers list them before torch loads; `olmo_repo.hf.DTYPES` maps them to torch dtypes."""

from __future__ import annotations

__all__ = ["DTYPE_NAMES"]

DTYPE_NAMES = ("float32", "bfloat16", "float16")
