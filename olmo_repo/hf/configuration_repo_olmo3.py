"""`RepoOlmo3Config`: transformers' `Olmo3Config` (OLMo 3: sliding windows) plus one position mode per layer.

Deltas from `Olmo3Config`: the keys `pe_mode`, `pe_start_layer` and `pe_layer_ids` and their checks, exactly
as `RepoOlmo2Config` has them (`check_repo_keys`); the RoPE check covers both of OLMo 3's RoPEs
(`rope_parameters.sliding_attention` and `.full_attention`): a RePo layer rotates its positions with the RoPE of
its own layer type. The position mode and the attention type of a layer are independent: a RePo layer may have a
sliding window or full attention, as `layer_types` says.

Remote code, like `configuration_repo_olmo2.py`: transformers, the standard library and its neighbours only.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Olmo3Config

from .configuration_repo_olmo2 import check_repo_keys

__all__ = ["RepoOlmo3Config"]


@strict
class RepoOlmo3Config(Olmo3Config):
    r"""
    pe_mode (`str`, *optional*, defaults to `"rope"`):
        Position mode of the selected layers: `rope` (integer positions, stock), `nope` (no rotation) or
        `repo` (real positions predicted from the hidden state). Unselected layers use `rope`.
    pe_start_layer (`int`, *optional*, defaults to 0):
        First selected layer, 0-indexed.
    pe_layer_ids (`list[int]`, *optional*):
        If set, only these layers (those also >= `pe_start_layer`) are selected.
    """

    model_type = "repo_olmo3"

    pe_mode: str = "rope"
    pe_start_layer: int = 0
    pe_layer_ids: list[int] | None = None

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        ropes = self.rope_parameters or {}
        check_repo_keys(self, {f"rope_parameters.{kind}": ropes[kind] for kind in sorted(ropes)})
