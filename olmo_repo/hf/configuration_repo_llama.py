"""`RepoLlamaConfig`: transformers' `LlamaConfig` plus one position mode per layer.

Deltas from `LlamaConfig`: the keys `pe_mode`, `pe_start_layer` and `pe_layer_ids` and their checks, exactly
as `RepoOlmo2Config` has them (`check_repo_keys`, run by `@strict` on construction and on `validate()`: one
`ValueError` naming the key). A RePo layer rotates its positions with the config's RoPE, which must not
depend on the sequence length: default, linear, YaRN or Llama 3's (`rope_type: llama3`, as Llama 3.1 and 3.2
have it); `dynamic` and `longrope` are refused.

Remote code, like `configuration_repo_olmo2.py`: transformers, the standard library and its neighbours only.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .configuration_repo_olmo2 import check_repo_keys

__all__ = ["RepoLlamaConfig"]


@strict
class RepoLlamaConfig(LlamaConfig):
    r"""
    pe_mode (`str`, *optional*, defaults to `"rope"`):
        Position mode of the selected layers: `rope` (integer positions, stock), `nope` (no rotation) or
        `repo` (real positions predicted from the hidden state). Unselected layers use `rope`.
    pe_start_layer (`int`, *optional*, defaults to 0):
        First selected layer, 0-indexed.
    pe_layer_ids (`list[int]`, *optional*):
        If set, only these layers (those also >= `pe_start_layer`) are selected.
    """

    model_type = "repo_llama"

    pe_mode: str = "rope"
    pe_start_layer: int = 0
    pe_layer_ids: list[int] | None = None

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        check_repo_keys(self, {"rope_parameters": self.rope_parameters or {}})
