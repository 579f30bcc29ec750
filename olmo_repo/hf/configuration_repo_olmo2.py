"""`RepoOlmo2Config`: transformers' `Olmo2Config` plus one position mode per layer.

Deltas from `Olmo2Config`:

- `pe_mode` (rope|nope|repo), `pe_start_layer`, `pe_layer_ids`: the same keys, selection rule
  (`layer_modes(config)`) and checks as every other backend, from `olmo_repo.modes`.
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

from .modes import PositionMode, check_position_modes

__all__ = ["ROPE_TYPES", "RepoOlmo2Config", "check_repo_keys"]

# RoPE variants whose inverse frequencies do not depend on the sequence length, so that RePo's real
# positions can be rotated with them: stock, linear interpolation, YaRN and Llama 3's (transformers 5.24's
# `_compute_llama3_parameters` ignores `seq_len`, and `dynamic_rope_update` recomputes only `dynamic` and
# `longrope` frequencies from the largest position id, which RePo positions are not: those stay refused).
ROPE_TYPES = ("default", "linear", "yarn", "llama3")


@strict
class RepoOlmo2Config(Olmo2Config):
    r"""
    pe_mode (`str`, *optional*, defaults to `"rope"`):
        Position mode of the selected layers: `rope` (integer positions, stock), `nope` (no rotation) or
        `repo` (real positions predicted from the hidden state). Unselected layers use `rope`.
    pe_start_layer (`int`, *optional*, defaults to 0):
        First selected layer, 0-indexed.
    pe_layer_ids (`list[int]`, *optional*):
        If set, only these layers (those also >= `pe_start_layer`) are selected.
    """

    model_type = "repo_olmo2"

    pe_mode: str = "rope"
    pe_start_layer: int = 0
    pe_layer_ids: list[int] | None = None

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

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        check_repo_keys(self, {"rope_parameters": self.rope_parameters or {}})


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
    for key, parameters in ropes.items():
        rope_type = parameters.get("rope_type", "default")
        if config.pe_mode == PositionMode.repo and rope_type not in ROPE_TYPES:
            raise ValueError(
                f"{key}.rope_type={rope_type!r} cannot rotate RePo positions; allowed with "
                f"pe_mode='repo': {', '.join(ROPE_TYPES)}"
            )
