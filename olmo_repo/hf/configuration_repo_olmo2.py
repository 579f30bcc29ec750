"""`RepoOlmo2Config`: transformers' `Olmo2Config` plus one position mode per layer.

Deltas from `Olmo2Config`:

- `pe_mode` (rope|nope|repo), `pe_start_layer`, `pe_layer_ids`: the same keys and selection rule as the OLMo
  side (`olmo_repo.config`): a layer takes `pe_mode` when its id is >= `pe_start_layer` and, if
  `pe_layer_ids` is set, in that list; every other layer keeps stock RoPE.
- Validation (`validate_position_modes`, run by `@strict` on construction and on `validate()`): one
  `ValueError` naming the key and what it allows.

This file is copied into converted checkpoints as remote code: it imports only transformers and the
standard library (the selection rule is restated here, not imported from `olmo_repo.config`; a test
checks that the two agree).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Olmo2Config

__all__ = ["PE_MODES", "ROPE_TYPES", "RepoOlmo2Config"]

PE_MODES = ("rope", "nope", "repo")
# RoPE variants whose inverse frequencies do not depend on the sequence length, so that RePo's real
# positions can be rotated with them: stock, linear interpolation and YaRN.
ROPE_TYPES = ("default", "linear", "yarn")


@strict
class RepoOlmo2Config(Olmo2Config):
    r"""
    pe_mode (`str`, *optional*, defaults to `"rope"`):
        Position mode of the selected layers: `rope` (integer positions, stock), `nope` (no rotation) or
        `repo` (per-head real positions predicted from the hidden state). Unselected layers use `rope`.
    pe_start_layer (`int`, *optional*, defaults to 0):
        First selected layer, 0-indexed.
    pe_layer_ids (`list[int]`, *optional*):
        If set, only these layers (those also >= `pe_start_layer`) are selected.
    """

    model_type = "repo_olmo2"

    pe_mode: str = "rope"
    pe_start_layer: int = 0
    pe_layer_ids: list[int] | None = None

    def layer_modes(self) -> list[str]:
        """The position mode of every layer: `pe_mode` for selected layers, `rope` for the others."""
        ids = self.pe_layer_ids
        return [
            self.pe_mode if i >= self.pe_start_layer and (ids is None or i in ids) else "rope"
            for i in range(self.num_hidden_layers)
        ]

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        n = self.num_hidden_layers
        if self.pe_mode not in PE_MODES:
            raise ValueError(f"pe_mode={self.pe_mode!r} is not supported; allowed: {', '.join(PE_MODES)}")
        if not 0 <= self.pe_start_layer < n:
            raise ValueError(
                f"pe_start_layer={self.pe_start_layer} is out of range: allowed 0..{n - 1} (num_hidden_layers={n})"
            )
        if self.pe_layer_ids is not None:
            bad = [i for i in self.pe_layer_ids if not 0 <= i < n]
            if bad:
                raise ValueError(f"pe_layer_ids has layer ids {bad} out of range: allowed 0..{n - 1}")
            if len(set(self.pe_layer_ids)) != len(self.pe_layer_ids):
                raise ValueError(f"pe_layer_ids={self.pe_layer_ids} repeats a layer id")
        if self.pe_mode == "rope":
            return
        if all(mode == "rope" for mode in self.layer_modes()):
            raise ValueError(
                f"pe_mode={self.pe_mode!r} selects no layer: pe_start_layer={self.pe_start_layer} and "
                f"pe_layer_ids={self.pe_layer_ids} have no layer in common"
            )
        if self.pe_mode == "repo":
            if self.num_key_value_heads != self.num_attention_heads:
                raise ValueError(
                    "pe_mode='repo' predicts one position per query head, so grouped-query attention is not "
                    f"supported: num_key_value_heads={self.num_key_value_heads} must equal "
                    f"num_attention_heads={self.num_attention_heads}"
                )
            rope_type = (self.rope_parameters or {}).get("rope_type", "default")
            if rope_type not in ROPE_TYPES:
                raise ValueError(
                    f"rope_parameters.rope_type={rope_type!r} cannot rotate RePo positions; allowed with "
                    f"pe_mode='repo': {', '.join(ROPE_TYPES)}"
                )
