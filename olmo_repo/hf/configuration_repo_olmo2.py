"""`RepoOlmo2Config`: transformers' `Olmo2Config` plus one position mode per layer.

Deltas from `Olmo2Config`:

- The position keys of every config of this project, declared once in `olmo_repo.modes.ScoredPositionKeys`
  (`RepoPositionKeys` below adds their checks; OLMo 3's, Llama's and Qwen 3's configs inherit it too): `pe_mode`
  (rope|nope|repo), `pe_start_layer`, `pe_layer_ids` (the same selection rule, `layer_modes(config)`, as every
  other backend), the index blend the model scores with (`pe_blend`; `pe_blend_init` and `pe_blend_steps` record
  the schedule of the run it was converted from) and `pe_positions` (learned, or the token index or one constant
  position in RePo layers: an ablation at evaluation).
- Validation (`validate_position_modes`, run by `@strict` on construction and on `validate()`): one
  `ValueError` naming the key and what it allows; here also the RoPE type, which must rotate real positions.
- `from_pretrained` also reads the reference implementation's format (`model_type: olmo2` with a nested
  `pe_config`) through `reference_reader`, which `import olmo_repo.hf` sets to the one reader of that format
  (`olmo_repo.hf.formats`, which reads weight names: this file does no I/O of its own).

This file is copied into converted checkpoints as remote code with `modes.py`: it imports only transformers,
the standard library and `.modes` (inside the package `olmo_repo/hf/modes.py` re-exports `olmo_repo.modes`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from transformers import Olmo2Config

from .modes import (
    PositionMode,
    ScoredPositionKeys,
    check_index_blend,
    check_position_modes,
    check_scored_positions,
    repo_layer_ids,
)

__all__ = ["ROPE_TYPES", "RepoOlmo2Config", "RepoPositionKeys", "check_repo_keys"]

# RoPE variants whose inverse frequencies do not depend on the sequence length, so that RePo's real
# positions can be rotated with them: stock, linear interpolation, YaRN and Llama 3's (transformers 5.24's
# `_compute_llama3_parameters` ignores `seq_len`, and `dynamic_rope_update` recomputes only `dynamic` and
# `longrope` frequencies from the largest position id, which RePo positions are not: those stay refused).
ROPE_TYPES = ("default", "linear", "yarn", "llama3")


class RepoPositionKeys(ScoredPositionKeys):
    r"""
    The position keys (`olmo_repo.modes.ScoredPositionKeys`) of the four HF configs, mixed in before
    transformers' config class; each config states only which RoPEs its RePo layers rotate with (`ropes`).

    pe_mode (`str`, *optional*, defaults to `"rope"`):
        Position mode of the selected layers: `rope` (integer positions, stock), `nope` (no rotation) or
        `repo` (real positions predicted from the hidden state). Unselected layers use `rope`.
    pe_start_layer (`int`, *optional*, defaults to 0):
        First selected layer, 0-indexed.
    pe_layer_ids (`list[int]`, *optional*):
        If set, only these layers (those also >= `pe_start_layer`) are selected.
    pe_blend_init (`float`, *optional*, defaults to 0.0):
        The index blend's p at step 0 of the run this model was trained in (recorded, not read by the model).
    pe_blend_steps (`int`, *optional*, defaults to 0):
        The steps over which that run's p fell to 0 (recorded, not read by the model).
    pe_blend (`float`, *optional*, defaults to 0.0):
        p of the index blend that RePo layers score with: they rotate by (1 - p) z + p i (z: f_phi's positions,
        i: the token's index). A checkpoint converted mid-anneal records its step's p.
    pe_positions (`str`, *optional*, defaults to `"learned"`):
        `learned` (f_phi's, blended by `pe_blend`), `index` (the token index: the RoPE layer RePo replaced) or
        `constant` (no rotation: NoPE) in RePo layers: an ablation at evaluation.
    """

    def ropes(self) -> dict[str, dict[str, Any]]:
        """Key -> rope parameters of every RoPE a RePo layer may rotate with (one; OLMo 3 has two)."""
        return {"rope_parameters": self.rope_parameters or {}}

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        check_repo_keys(self, self.ropes())


@strict
class RepoOlmo2Config(RepoPositionKeys, Olmo2Config):
    __doc__ = RepoPositionKeys.__doc__

    model_type = "repo_olmo2"

    reference_reader: ClassVar[Callable[..., dict[str, Any]] | None] = None
    """(config dict, path, **from_pretrained kwargs) -> the `repo_olmo2` dict of a reference-format config;
    None (remote code without the package): such a config is refused."""

    @classmethod
    def get_config_dict(
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> tuple[dict, dict]:
        """`PretrainedConfig.get_config_dict`; a reference-format config (`olmo2` + `pe_config`) is read by
        `reference_reader`."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if "pe_config" in config_dict:
            if cls.reference_reader is None:
                raise ValueError(
                    f"{pretrained_model_name_or_path}: a reference-format config (olmo2 with pe_config); "
                    "`import olmo_repo.hf` first, or convert it with scripts/convert_to_hf.py"
                )
            config_dict = cls.reference_reader(config_dict, pretrained_model_name_or_path, **kwargs)
        return config_dict, kwargs


def check_repo_keys(config: Any, ropes: dict[str, dict[str, Any]]) -> None:
    """The position-mode keys of an HF config (`RepoOlmo2Config`, `RepoOlmo3Config`, `RepoLlamaConfig`,
    `RepoQwen3Config`) and the RoPEs that RePo layers would rotate with (`ropes`: key -> rope parameters, one
    per RoPE of the model): one `ValueError` naming the key."""
    check_position_modes(
        config.pe_mode,
        config.pe_start_layer,
        config.pe_layer_ids,
        n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        keys={
            "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads",
            "n_kv_heads": "num_key_value_heads",
        },
    )
    has_repo = bool(repo_layer_ids(config))
    check_index_blend(config.pe_blend_init, config.pe_blend_steps, has_repo=has_repo)
    check_scored_positions(config.pe_blend, config.pe_positions, has_repo=has_repo)
    for key, parameters in ropes.items():
        rope_type = parameters.get("rope_type", "default")
        if config.pe_mode == PositionMode.repo and rope_type not in ROPE_TYPES:
            raise ValueError(
                f"{key}.rope_type={rope_type!r} cannot rotate RePo positions; allowed with "
                f"pe_mode='repo': {', '.join(ROPE_TYPES)}"
            )
