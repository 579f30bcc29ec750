"""The Hugging Face formats this project reads, and the one reader of the reference implementation's.

- `repo_olmo2` (this project's converted checkpoints) and stock `olmo2` are read as transformers reads them.
- The reference implementation writes `model_type: olmo2` with a nested `pe_config`, which stock transformers
  would build as a stock Olmo2, dropping the RePo weights. `from_reference` is the one translation of it,
  used by `read_hf_config` (conversion, evaluation, the explorer), the Auto routing of `olmo_repo.hf`,
  `RepoOlmo2Config.from_pretrained` (through `RepoOlmo2Config.reference_reader`, set by `import
  olmo_repo.hf`) and vLLM (`olmo_repo.vllm.config`). It reads `pe_config` as the reference's model reads it,
  and checks it against the layers whose weights carry f_phi, which are the truth.

This module reads weight names (safetensors headers, index files, the Hub), so it is not remote code.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
from transformers import Olmo2Config
from transformers.utils import cached_file

from ..modes import F_PHI_WEIGHTS, PositionMode, layer_modes, parse_layer_ids, reference_mode
from .configuration_repo_olmo2 import RepoOlmo2Config

__all__ = ["from_reference", "hub_kwargs", "read_hf_config", "read_reference", "weight_names"]

_REPO_WEIGHT = re.compile(rf"(?:model\.)?layers\.(\d+)\.self_attn\.(?:{'|'.join(F_PHI_WEIGHTS)})\.weight")


def hub_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `from_pretrained` that say where the files are."""
    keys = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
    return {k: kwargs[k] for k in keys if k in kwargs}


def _safetensors_names(path: str) -> list[str]:
    """Tensor names from a safetensors header (8-byte little-endian length, then JSON), without the data."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        try:
            header = json.loads(f.read(length))
        except ValueError:
            raise ValueError(f"{path} is truncated or corrupt (unreadable safetensors header)") from None
    return [name for name in header if name != "__metadata__"]


def weight_names(path: str | os.PathLike, **hub: Any) -> list[str] | None:
    """Names of the weights of a local HF directory or Hub repository (safetensors, sharded or not, or
    pytorch_model.bin), read without loading tensors; None if it has no weights."""
    # transformers' private `_raise_exceptions_for_missing_entries` (5.24): None for a missing file, as
    # `cached_file` has no public switch for that (canary: olmo_repo.upstream.transformers).
    find = lambda name: cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub)  # noqa: E731
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (file := find(index)) is not None:
            with open(file) as f:
                return list(json.load(f)["weight_map"])
    if (file := find("model.safetensors")) is not None:
        return _safetensors_names(file)
    if (file := find("pytorch_model.bin")) is not None:
        return list(torch.load(file, map_location="meta", weights_only=True, mmap=True))
    return None


def _pe_keys(pe_config: dict[str, Any], n_layers: int, weights: Iterable[str] | None, source: str) -> dict:
    """`pe_config` -> `pe_mode`, `pe_start_layer`, `pe_layer_ids`, read as the reference's model reads it:
    `dynamic_pe_mode` and the misspelled `dynmaic_pe_start_layer` (default 0) and `dynmaic_pe_layer_ids`
    ("2,5,8"; "" or absent: every layer). Its model ignores the correctly spelled `dynamic_pe_start_layer` /
    `dynamic_pe_layer_ids` that its converter also writes, and so does this."""
    mode = str(pe_config.get("dynamic_pe_mode", "none"))
    try:
        pe_mode = reference_mode(mode, "pe_config.dynamic_pe_mode")
        start = int(pe_config.get("dynmaic_pe_start_layer", 0))
        ids = parse_layer_ids(pe_config.get("dynmaic_pe_layer_ids", ""), "pe_config.dynmaic_pe_layer_ids")
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    keys = dict(pe_mode=str(pe_mode), pe_start_layer=start, pe_layer_ids=ids)
    if weights is None:
        return keys
    carried = sorted({int(m[1]) for name in weights if (m := _REPO_WEIGHT.fullmatch(name))})
    modes = layer_modes(SimpleNamespace(**keys), n_layers)
    selected = [i for i, m in enumerate(modes) if m != PositionMode.rope]
    if carried != (selected if pe_mode == PositionMode.repo else []):
        described = f"{pe_mode} in layers {selected}" if pe_mode != PositionMode.rope else "no RePo layer"
        raise ValueError(
            f"{source}: the weights carry RePo (gate_map/content_map/final_map) in layers {carried or 'none'}, "
            f"but pe_config selects {described} (dynamic_pe_mode={mode!r}, dynmaic_pe_start_layer={start}, "
            f"dynmaic_pe_layer_ids={pe_config.get('dynmaic_pe_layer_ids', '')!r}, as the reference's model "
            "reads them): correct pe_config so that both agree"
        )
    return keys


def from_reference(config_dict: dict[str, Any], weights: Iterable[str] | None, source: str) -> dict[str, Any]:
    """A reference-format config dict (`olmo2` + `pe_config`) as a `repo_olmo2` config dict; checked against
    the checkpoint's weight names when they are given. ValueError starting with `source` otherwise."""
    rest = {k: v for k, v in config_dict.items() if k not in ("pe_config", "architectures")}
    n_layers = rest.get("num_hidden_layers", RepoOlmo2Config.num_hidden_layers)
    pe = _pe_keys(config_dict["pe_config"], n_layers, weights, source)
    return {**rest, **pe, "model_type": RepoOlmo2Config.model_type}


def read_reference(config_dict: dict[str, Any], path: str | os.PathLike, **kwargs: Any) -> dict[str, Any]:
    """`from_reference` checked against the weights at `path` (a directory or Hub id; `from_pretrained`'s
    keyword arguments say where)."""
    return from_reference(config_dict, weight_names(path, **hub_kwargs(kwargs)), str(path))


def read_hf_config(hf_dir: str | os.PathLike) -> Olmo2Config:
    """The config of an HF directory: `repo_olmo2` (this project), stock `olmo2`, or `olmo2` with the
    reference's `pe_config` (-> `RepoOlmo2Config`, checked against the layers that carry RePo weights;
    `Olmo2Config` if it selects no RePo/NoPE layer)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        raw = json.load(f)
    model_type = raw.get("model_type")
    if model_type not in ("olmo2", RepoOlmo2Config.model_type):
        raise ValueError(f"{hf_dir}: model_type={model_type!r} is not supported; allowed: olmo2, repo_olmo2")
    if "pe_config" in raw:
        raw = read_reference(raw, hf_dir)
    for key in ("model_type", "auto_map", "architectures", "transformers_version"):
        raw.pop(key, None)
    if model_type == RepoOlmo2Config.model_type or raw.get("pe_mode", "rope") != "rope":
        return RepoOlmo2Config.from_dict(raw)
    return Olmo2Config.from_dict({k: v for k, v in raw.items() if not k.startswith("pe_")})
