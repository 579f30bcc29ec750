"""The Hugging Face formats this project reads, and the one reader of the reference implementation's.

- `repo_olmo2`, `repo_olmo3` (this project's converted checkpoints) and stock `olmo2`, `olmo3` are read as
  transformers reads them; so are `llama`, `qwen3`, `repo_llama` and `repo_qwen3` where a reader asks for them
  (`read_hf_config(..., model_types=ALL_MODEL_TYPES)`: the OLMo-core converter; the ai2-olmo side has the OLMo
  block alone, so by default they are refused in one line rather than read as an OLMo model).
- The reference implementation writes `model_type: olmo2` with a nested `pe_config`, which stock transformers
  would build as a stock Olmo2, dropping the RePo weights. `from_reference` is the one translation of it,
  used by `read_hf_config` (conversion, evaluation, the explorer), the Auto routing of `olmo_repo.hf`,
  `RepoOlmo2Config.from_pretrained` (through `RepoOlmo2Config.reference_reader`, set by `import
  olmo_repo.hf`) and vLLM (`olmo_repo.vllm.config`). It reads `pe_config` as the reference's model reads it,
  and checks it against the layers whose weights carry f_phi, which are the truth.

`check_f_phi` checks a checkpoint's f_phi weights against its config (one position per key/value head) before
anything loads them. This module reads weight names and shapes (safetensors headers, index files, the Hub),
so it is not remote code.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Collection, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import LlamaConfig, Olmo2Config, Olmo3Config, PreTrainedConfig, Qwen3Config
from transformers.utils import cached_file

from ..errors import command
from ..integrity import olmo_core_checkpoint_problem
from ..modes import (
    F_PHI_HIDDEN_RATIO,
    F_PHI_WEIGHTS,
    REFERENCE_BLEND_KEYS,
    PositionMode,
    check_pe_keys,
    check_position_modes,
    layer_modes,
    parse_layer_ids,
    reference_mode,
)
from ..rope import check_final_map_rows
from .configuration_repo_llama import RepoLlamaConfig
from .configuration_repo_olmo2 import RepoOlmo2Config
from .configuration_repo_olmo3 import RepoOlmo3Config
from .configuration_repo_qwen3 import RepoQwen3Config

__all__ = [
    "ALL_MODEL_TYPES",
    "OLMO_MODEL_TYPES",
    "check_f_phi",
    "from_reference",
    "reference_config",
    "hub_kwargs",
    "read_hf_config",
    "read_reference",
    "weight_shapes",
]

OLMO_MODEL_TYPES = ("olmo2", RepoOlmo2Config.model_type, "olmo3", RepoOlmo3Config.model_type)
"""The model types of the OLMo block (ai2-olmo's and OLMo-core's Olmo 2 / Olmo 3 shapes): `read_hf_config`'s
default."""
ALL_MODEL_TYPES = (
    *OLMO_MODEL_TYPES,
    "llama",
    RepoLlamaConfig.model_type,
    "qwen3",
    RepoQwen3Config.model_type,
)
"""Those and the pre-norm families OLMo-core also builds (Llama, Qwen 3), stock and RePo."""

_F_PHI_WEIGHT = re.compile(rf"(?:model\.)?layers\.(\d+)\.self_attn\.({'|'.join(F_PHI_WEIGHTS)})\.weight")


def hub_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `from_pretrained` that say where the files are."""
    keys = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
    return {k: kwargs[k] for k in keys if k in kwargs}


Shapes = dict[str, tuple[int, ...] | None]
"""Weight name -> shape (None where only an index names the weight)."""


def _safetensors_shapes(path: str) -> Shapes:
    """Tensor shapes from a safetensors header (8-byte little-endian length, then JSON), without the data."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        try:
            header = json.loads(f.read(length))
        except ValueError:
            raise ValueError(f"{path} is truncated or corrupt (unreadable safetensors header)") from None
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def weight_shapes(path: str | os.PathLike, **hub: Any) -> Shapes | None:
    """The weights of a local HF directory or Hub repository (safetensors, sharded or not, or
    pytorch_model.bin) and their shapes, read without loading tensors; None if it has no weights. Of a sharded
    checkpoint on the Hub only the index is read (shapes None)."""
    # transformers' private `_raise_exceptions_for_missing_entries` (5.24): None for a missing file, as
    # `cached_file` has no public switch for that (canary: olmo_repo.upstream.transformers).
    find = lambda name: cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub)  # noqa: E731
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (file := find(index)) is not None:
            with open(file) as f:
                weight_map = json.load(f)["weight_map"]
            shards = {Path(path) / name for name in set(weight_map.values())}
            if index.startswith("model.safetensors") and all(shard.is_file() for shard in shards):
                return {k: v for shard in sorted(shards) for k, v in _safetensors_shapes(str(shard)).items()}
            return dict.fromkeys(weight_map)
    if (file := find("model.safetensors")) is not None:
        return _safetensors_shapes(file)
    if (file := find("pytorch_model.bin")) is not None:
        state = torch.load(file, map_location="meta", weights_only=True, mmap=True)
        return {name: tuple(tensor.shape) for name, tensor in state.items()}
    return None


def check_f_phi(shapes: Shapes | None, config: PreTrainedConfig, source: str) -> None:
    """Every f_phi weight among `shapes` (a checkpoint's) has the shape that `config` builds: gate_map and
    content_map [d // 8, d], final_map [num_key_value_heads, d // 8] (one position per key/value head).
    One ValueError naming the weight and the sizes otherwise."""
    d, n_kv = config.hidden_size, config.num_key_value_heads
    hidden = d // F_PHI_HIDDEN_RATIO
    expected = {"gate_map": (hidden, d), "content_map": (hidden, d), "final_map": (n_kv, hidden)}
    for name, shape in (shapes or {}).items():
        if shape is None or not (m := _F_PHI_WEIGHT.fullmatch(name)) or shape == expected[m[2]]:
            continue
        if m[2] == "final_map":
            check_final_map_rows(shape[0], n_kv, f"{source}: {name}")
        raise ValueError(
            f"{source}: {name} has shape {shape}, but hidden_size={d} needs {expected[m[2]]} (f_phi's hidden "
            f"width is hidden_size // {F_PHI_HIDDEN_RATIO})"
        )


def _pe_keys(pe_config: dict[str, Any], n_layers: int, weights: Iterable[str] | None, source: str) -> dict:
    """`pe_config` -> `pe_mode`, `pe_start_layer`, `pe_layer_ids`, read as the reference's model reads it:
    `dynamic_pe_mode` and the misspelled `dynmaic_pe_start_layer` (default 0) and `dynmaic_pe_layer_ids`
    ("2,5,8"; "" or absent: every layer). Its model ignores the correctly spelled `dynamic_pe_start_layer` /
    `dynamic_pe_layer_ids` that its converter also writes, and so does this. Its blend schedule
    (`dynamic_pe_init_pdrop`, `dynamic_pe_dropout_anneal_step`) is recorded as `pe_blend_init`/`pe_blend_steps`;
    the model scores with p = 0 (`pe_blend`'s default), as its own code scores it (its forward's p defaults to
    0 and nothing passes another)."""
    mode = str(pe_config.get("dynamic_pe_mode", "none"))
    try:
        pe_mode = reference_mode(mode, "pe_config.dynamic_pe_mode")
        start = int(pe_config.get("dynmaic_pe_start_layer", 0))
        ids = parse_layer_ids(pe_config.get("dynmaic_pe_layer_ids", ""), "pe_config.dynmaic_pe_layer_ids")
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    keys = dict(pe_mode=str(pe_mode), pe_start_layer=start, pe_layer_ids=ids)
    if (
        pe_mode == PositionMode.repo
    ):  # a schedule on another mode blends nothing: the trainers would refuse it
        keys |= {
            ours: pe_config[theirs] for theirs, ours in REFERENCE_BLEND_KEYS.items() if theirs in pe_config
        }
    if weights is None:
        return keys
    carried = sorted({int(m[1]) for name in weights if (m := _F_PHI_WEIGHT.fullmatch(name))})
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


def reference_config(config_dict: dict[str, Any], shapes: Shapes | None, source: str) -> RepoOlmo2Config:
    """`from_reference` as a `RepoOlmo2Config`, its f_phi weights checked (`check_f_phi`) when `shapes` are
    given."""
    config = RepoOlmo2Config.from_dict(from_reference(config_dict, shapes, source))
    check_f_phi(shapes, config, source)
    return config


def read_reference(config_dict: dict[str, Any], path: str | os.PathLike, **kwargs: Any) -> dict[str, Any]:
    """`from_reference` checked against the weights at `path` (a directory or Hub id; `from_pretrained`'s
    keyword arguments say where)."""
    return from_reference(config_dict, weight_shapes(path, **hub_kwargs(kwargs)), str(path))


def read_hf_config(
    hf_dir: str | os.PathLike, model_types: Collection[str] = OLMO_MODEL_TYPES
) -> PreTrainedConfig:
    """The config of an HF directory: `repo_olmo2` / `repo_olmo3` (this project), stock `olmo2` / `olmo3`, or
    `olmo2` with the reference's `pe_config` (-> `RepoOlmo2Config`, checked against the layers that carry RePo
    weights; `Olmo2Config` if it selects no RePo/NoPE layer); with `model_types` also the Llama and Qwen 3
    families (`ALL_MODEL_TYPES`). Any other model type is one ValueError listing those allowed, so a reader
    that knows one block shape never takes another. f_phi's weights are checked against it."""
    if problem := olmo_core_checkpoint_problem(hf_dir, command("core_convert_to_hf")):
        raise ValueError(problem)
    file = os.path.join(hf_dir, "config.json")
    with open(file) as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{file} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file} is not a JSON object of config keys")
    model_type = raw.get("model_type")
    if model_type not in model_types or model_type not in _CONFIGS:
        hint = ""
        if model_type in ALL_MODEL_TYPES:  # a family this project trains, but on OLMo-core only
            hint = (
                f" (Llama and Qwen 3 train with OLMo-core: {command('core_convert_from_hf')} converts them)"
            )
        raise ValueError(
            f"{hf_dir}: model_type={model_type!r} is not supported; allowed: {', '.join(model_types)}{hint}"
        )
    shapes = weight_shapes(hf_dir)
    if "pe_config" in raw and model_type in OLMO_MODEL_TYPES:  # the reference's format is OLMo's alone
        raw = from_reference(raw, shapes, str(hf_dir))
    for key in ("model_type", "auto_map", "architectures", "transformers_version"):
        raw.pop(key, None)
    check_pe_keys(raw, file)  # a misspelt key would read as RoPE, weights dropped
    stock, repo = _CONFIGS[model_type]
    if model_type == repo.model_type or raw.get("pe_mode", PositionMode.rope) != PositionMode.rope:
        config = repo.from_dict(raw)
        check_f_phi(shapes, config, str(hf_dir))
        return config
    config = stock.from_dict({k: v for k, v in raw.items() if not k.startswith("pe_")})
    try:  # the rules of every model here (the RePo configs check them on construction): head groups
        check_position_modes(
            PositionMode.rope,
            0,
            None,
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads or config.num_attention_heads,
            keys={
                "n_layers": "num_hidden_layers",
                "n_heads": "num_attention_heads",
                "n_kv_heads": "num_key_value_heads",
            },  # fmt: skip
        )
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    return config


# model_type -> (the stock config, the RePo config) of the family
_CONFIGS: dict[str, tuple[type[PreTrainedConfig], type[PreTrainedConfig]]] = {
    "olmo2": (Olmo2Config, RepoOlmo2Config),
    RepoOlmo2Config.model_type: (Olmo2Config, RepoOlmo2Config),
    "olmo3": (Olmo3Config, RepoOlmo3Config),
    RepoOlmo3Config.model_type: (Olmo3Config, RepoOlmo3Config),
    "llama": (LlamaConfig, RepoLlamaConfig),
    RepoLlamaConfig.model_type: (LlamaConfig, RepoLlamaConfig),
    "qwen3": (Qwen3Config, RepoQwen3Config),
    RepoQwen3Config.model_type: (Qwen3Config, RepoQwen3Config),
}
