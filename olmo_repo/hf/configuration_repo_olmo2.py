"""`RepoOlmo2Config`: transformers' `Olmo2Config` plus one position mode per layer.

Deltas from `Olmo2Config`:

- `pe_mode` (rope|nope|repo), `pe_start_layer`, `pe_layer_ids`: the same keys, selection rule and checks as
  the OLMo side, from `olmo_repo.modes`.
- Validation (`validate_position_modes`, run by `@strict` on construction and on `validate()`): one
  `ValueError` naming the key and what it allows; here also the RoPE type, which must rotate real positions.
- `from_pretrained` also reads the reference implementation's format (`model_type: olmo2` with a nested
  `pe_config`): `reference_pe_keys` is the one translation of it, used by the converters too.

This file is copied into converted checkpoints as remote code with `modes.py`: it imports only transformers,
torch, the standard library and `.modes` (inside the package `olmo_repo/hf/modes.py` re-exports
`olmo_repo.modes`). transformers' private names it needs come through `olmo_repo.upstream.transformers`
inside the package; remote code cannot import the package, so the one it uses is marked below.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from transformers import Olmo2Config
from transformers.utils import cached_file

from .modes import F_PHI_WEIGHTS, check_position_modes, layer_modes, parse_layer_ids, reference_mode

__all__ = [
    "ROPE_TYPES",
    "RepoOlmo2Config",
    "hub_kwargs",
    "read_hf_config",
    "reference_pe_keys",
    "weight_names",
]

# RoPE variants whose inverse frequencies do not depend on the sequence length, so that RePo's real
# positions can be rotated with them: stock, linear interpolation and YaRN.
ROPE_TYPES = ("default", "linear", "yarn")
_REPO_WEIGHT = re.compile(rf"(?:model\.)?layers\.(\d+)\.self_attn\.(?:{'|'.join(F_PHI_WEIGHTS)})\.weight")


def reference_pe_keys(
    pe_config: dict[str, Any],
    num_layers: int,
    weights: Iterable[str] | None = None,
    source: str = "config.json",
) -> dict[str, Any]:
    """The reference's `pe_config` -> `pe_mode`, `pe_start_layer`, `pe_layer_ids`, read as the reference's
    model reads it: `dynamic_pe_mode` and the misspelled `dynmaic_pe_start_layer` (default 0) and
    `dynmaic_pe_layer_ids` ("2,5,8"; "" or absent: every layer). Its model ignores the correctly spelled
    `dynamic_pe_start_layer`/`dynamic_pe_layer_ids` that its converter also writes, and so does this.

    The layers whose weights carry gate_map/content_map/final_map are the truth: given the checkpoint's
    weight names, they must be exactly the RePo layers of this selection, else one ValueError names both.
    """
    mode = str(pe_config.get("dynamic_pe_mode", "none"))
    try:
        pe_mode = reference_mode(mode, "pe_config.dynamic_pe_mode")
        start = int(pe_config.get("dynmaic_pe_start_layer", 0))
        ids = parse_layer_ids(pe_config.get("dynmaic_pe_layer_ids", ""), "pe_config.dynmaic_pe_layer_ids")
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    keys = dict(pe_mode=pe_mode, pe_start_layer=start, pe_layer_ids=ids)
    if weights is not None:
        carried = sorted({int(m[1]) for name in weights if (m := _REPO_WEIGHT.fullmatch(name))})
        modes = layer_modes(pe_mode, num_layers, start, ids)
        selected = [i for i, m in enumerate(modes) if m != "rope"]
        if carried != (selected if pe_mode == "repo" else []):
            described = (
                f"{keys['pe_mode']} in layers {selected}" if keys["pe_mode"] != "rope" else "no RePo layer"
            )
            raise ValueError(
                f"{source}: the weights carry RePo (gate_map/content_map/final_map) in layers {carried or 'none'}, "
                f"but pe_config selects {described} "
                f"(dynamic_pe_mode={mode!r}, dynmaic_pe_start_layer={start}, dynmaic_pe_layer_ids="
                f"{pe_config.get('dynmaic_pe_layer_ids', '')!r}, as the reference's model reads them): correct "
                "pe_config so that both agree"
            )
    return keys


def _safetensors_names(path: str) -> list[str]:
    """Tensor names from a safetensors header (8-byte little-endian length, then JSON), without the data."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        try:
            header = json.loads(f.read(length))
        except ValueError:
            raise ValueError(f"{path} is truncated or corrupt (unreadable safetensors header)") from None
    return [name for name in header if name != "__metadata__"]


def hub_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `from_pretrained` that say where the files are."""
    keys = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
    return {k: kwargs[k] for k in keys if k in kwargs}


def weight_names(path: str | os.PathLike, **hub_kwargs: Any) -> list[str] | None:
    """Names of the weights of a local HF directory or Hub repository (safetensors, sharded or not, or
    pytorch_model.bin), read without loading tensors; None if it has no weights."""
    # transformers' private `_raise_exceptions_for_missing_entries` (5.24): None for a missing file, as
    # `cached_file` has no public switch for that (canary: tests/test_upstream.py).
    find = lambda name: cached_file(  # noqa: E731
        path, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs
    )
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (file := find(index)) is not None:
            with open(file) as f:
                return list(json.load(f)["weight_map"])
    if (file := find("model.safetensors")) is not None:
        return _safetensors_names(file)
    if (file := find("pytorch_model.bin")) is not None:
        return list(torch.load(file, map_location="meta", weights_only=True, mmap=True))
    return None


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

    @classmethod
    def get_config_dict(
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> tuple[dict, dict]:
        """`PretrainedConfig.get_config_dict`; a reference-format config (`olmo2` + `pe_config`) is translated
        by `reference_pe_keys`, checked against the layers that carry RePo weights."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if "pe_config" in config_dict:
            names = weight_names(pretrained_model_name_or_path, **hub_kwargs(kwargs))
            config_dict = cls.dict_from_reference(config_dict, names, str(pretrained_model_name_or_path))
        return config_dict, kwargs

    @classmethod
    def dict_from_reference(
        cls, config_dict: dict[str, Any], weights: Iterable[str] | None, source: str
    ) -> dict[str, Any]:
        """A reference-format config dict (`olmo2` + `pe_config`) as a `repo_olmo2` config dict."""
        rest = {k: v for k, v in config_dict.items() if k not in ("pe_config", "architectures")}
        n_layers = rest.get("num_hidden_layers", cls.num_hidden_layers)
        pe = reference_pe_keys(config_dict["pe_config"], n_layers, weights, source)
        return {**rest, **pe, "model_type": cls.model_type}

    def layer_modes(self) -> list[str]:
        """The position mode of every layer: `pe_mode` for selected layers, `rope` for the others."""
        return layer_modes(self.pe_mode, self.num_hidden_layers, self.pe_start_layer, self.pe_layer_ids)

    def validate_position_modes(self) -> None:
        """Raise one `ValueError` naming the bad key and what it allows."""
        sizes = {
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
        }
        check_position_modes(self.pe_mode, self.pe_start_layer, self.pe_layer_ids, sizes)
        rope_type = (self.rope_parameters or {}).get("rope_type", "default")
        if self.pe_mode == "repo" and rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_parameters.rope_type={rope_type!r} cannot rotate RePo positions; allowed with "
                f"pe_mode='repo': {', '.join(ROPE_TYPES)}"
            )


def read_hf_config(hf_dir: str | os.PathLike) -> Olmo2Config:
    """The config of an HF directory: `repo_olmo2` (this project), stock `olmo2`, or `olmo2` with the
    reference's `pe_config` (-> `RepoOlmo2Config` through `RepoOlmo2Config.dict_from_reference`, checked
    against the layers that carry RePo weights; `Olmo2Config` if it selects no RePo/NoPE layer)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        raw = json.load(f)
    model_type = raw.get("model_type")
    if model_type not in ("olmo2", RepoOlmo2Config.model_type):
        raise ValueError(f"{hf_dir}: model_type={model_type!r} is not supported; allowed: olmo2, repo_olmo2")
    if "pe_config" in raw:
        raw = RepoOlmo2Config.dict_from_reference(raw, weight_names(hf_dir), str(hf_dir))
    for key in ("model_type", "auto_map", "architectures", "transformers_version"):
        raw.pop(key, None)
    if model_type == RepoOlmo2Config.model_type or raw.get("pe_mode", "rope") != "rope":
        return RepoOlmo2Config.from_dict(raw)
    return Olmo2Config.from_dict({k: v for k, v in raw.items() if not k.startswith("pe_")})
