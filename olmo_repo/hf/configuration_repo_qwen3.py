"""`RepoQwen3Config`: transformers' `Qwen3Config` plus one position mode per layer.

Deltas from `Qwen3Config`: the keys `pe_mode`, `pe_start_layer` and `pe_layer_ids` and their checks, exactly
as `RepoOlmo2Config` has them (`check_repo_keys`, run by `@strict` on construction and on `validate()`: one
`ValueError` naming the key), the RoPE check included. As in `RepoOlmo3Config`, the position mode and the
attention type of a layer (`layer_types`: sliding window or full attention) are independent.

Remote code, like `configuration_repo_olmo2.py`: transformers, the standard library and its neighbours only.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

from .configuration_repo_olmo2 import check_repo_keys

__all__ = ["RepoQwen3Config"]


@strict
class RepoQwen3Config(Qwen3Config):
    r"""
    pe_mode (`str`, *optional*, defaults to `"rope"`):
        Position mode of the selected layers: `rope` (integer positions, stock), `nope` (no rotation) or
        `repo` (real positions predicted from the hidden state). Unselected layers use `rope`.
    pe_start_layer (`int`, *optional*, defaults to 0):
        First selected layer, 0-indexed.
    pe_layer_ids (`list[int]`, *optional*):
        If set, only these layers (those also >= `pe_start_layer`) are selected.
    """

    model_type = "repo_qwen3"

    pe_mode: str = "rope"
    pe_start_layer: int = 0
    pe_layer_ids: list[int] | None = None

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        check_repo_keys(self, {"rope_parameters": self.rope_parameters or {}})
