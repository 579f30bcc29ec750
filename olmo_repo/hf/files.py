"""Hugging Face directories as this project reads and writes them, for every converter (ai2-olmo's in
`olmo_repo.ai2olmo.hf`, OLMo-core's in `olmo_repo.olmocore.hf`): weights read strictly, a model saved with its
tokenizer, generation config and, for RePo/NoPE models, the remote code. torch and transformers only.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import Tensor
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    PreTrainedConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ..integrity import require_intact
from ..modes import PE_KEYS, SCORED_PE_KEYS
from .configuration_repo_llama import RepoLlamaConfig
from .configuration_repo_olmo2 import RepoOlmo2Config
from .configuration_repo_olmo3 import RepoOlmo3Config
from .configuration_repo_qwen3 import RepoQwen3Config
from .modeling_repo_llama import RepoLlamaForCausalLM
from .modeling_repo_olmo2 import RepoOlmo2ForCausalLM
from .modeling_repo_olmo3 import RepoOlmo3ForCausalLM
from .modeling_repo_qwen3 import RepoQwen3ForCausalLM

__all__ = [
    "AUTO_MAP",
    "MODEL_CLASSES",
    "REMOTE_CODE",
    "as_stock",
    "carried",
    "check_state_dict",
    "context_length",
    "over_stock",
    "read_hf_state_dict",
    "save_hf",
    "save_tokenizer",
    "tokenizer_beside",
]

MODEL_CLASSES = {
    Olmo2Config: Olmo2ForCausalLM,
    RepoOlmo2Config: RepoOlmo2ForCausalLM,
    Olmo3Config: Olmo3ForCausalLM,
    RepoOlmo3Config: RepoOlmo3ForCausalLM,
    LlamaConfig: LlamaForCausalLM,
    RepoLlamaConfig: RepoLlamaForCausalLM,
    Qwen3Config: Qwen3ForCausalLM,
    RepoQwen3Config: RepoQwen3ForCausalLM,
}
"""The causal LM of each config class a converter writes (stock where every layer is RoPE)."""

HF_DIR = Path(__file__).resolve().parent
_OLMO2_CODE = {
    "configuration_repo_olmo2.py": HF_DIR / "configuration_repo_olmo2.py",
    "modeling_repo_olmo2.py": HF_DIR / "modeling_repo_olmo2.py",
    "rope.py": HF_DIR.parent / "rope.py",
    "rotation.py": HF_DIR.parent / "rotation.py",
    "modes.py": HF_DIR.parent / "modes.py",
}
REMOTE_CODE = {
    RepoOlmo2Config.model_type: _OLMO2_CODE,
    **{
        model_type: {
            **_OLMO2_CODE,  # the mixins, and the RoPE check of the configuration, which each model builds on
            f"configuration_{model_type}.py": HF_DIR / f"configuration_{model_type}.py",
            f"modeling_{model_type}.py": HF_DIR / f"modeling_{model_type}.py",
        }
        for model_type in (
            RepoOlmo3Config.model_type,
            RepoLlamaConfig.model_type,
            RepoQwen3Config.model_type,
        )
    },
}
"""Remote code of a converted RePo checkpoint, by model type: its modeling files, `olmo_repo/rope.py` (with the
`rotation.py` it imports) and `olmo_repo/modes.py` (and `modeling_repo_olmo2.py`, `configuration_repo_olmo2.py`
for every other family)."""
AUTO_MAP = {
    model_type: {
        "AutoConfig": f"configuration_{model_type}.{name}Config",
        "AutoModel": f"modeling_{model_type}.{name}Model",
        "AutoModelForCausalLM": f"modeling_{model_type}.{name}ForCausalLM",
    }
    for model_type, name in (
        (RepoOlmo2Config.model_type, "RepoOlmo2"),
        (RepoOlmo3Config.model_type, "RepoOlmo3"),
        (RepoLlamaConfig.model_type, "RepoLlama"),
        (RepoQwen3Config.model_type, "RepoQwen3"),
    )
}
"""The `auto_map` of a converted RePo checkpoint's config.json, by model type."""
# Non-persistent RoPE buffers that old transformers versions (the reference's) saved with the weights.
_HF_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def read_hf_state_dict(hf_dir: Path) -> dict[str, Tensor]:
    """Every weight of an HF directory (safetensors, or pytorch_model*.bin), each file checked intact first."""
    files = sorted(hf_dir.glob("*.safetensors")) or sorted(hf_dir.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"{hf_dir} has no *.safetensors or pytorch_model*.bin weights")
    state_dict: dict[str, Tensor] = {}
    for file in tqdm(files, desc="reading HF weights", unit="file"):
        require_intact(file)
        shard = (
            load_file(file)
            if file.suffix == ".safetensors"
            else torch.load(file, map_location="cpu", weights_only=True)
        )
        state_dict.update({k: v for k, v in shard.items() if not _HF_IGNORED.fullmatch(k)})
    return state_dict


def save_tokenizer(base: Tokenizer, config: PreTrainedConfig, out: Path) -> None:
    """Save `base` as a transformers tokenizer with the model's eos/pad tokens."""

    def token(ids: int | list[int] | None) -> str | None:  # Llama 3 Instruct lists several end ids: the first
        i = ids[0] if isinstance(ids, list) and ids else ids
        return base.id_to_token(i) if isinstance(i, int) and i < base.get_vocab_size() else None

    eos, pad = token(config.eos_token_id), token(config.pad_token_id)
    PreTrainedTokenizerFast(tokenizer_object=base, eos_token=eos, pad_token=pad or eos).save_pretrained(out)


def save_hf(
    config: PreTrainedConfig, state_dict: dict[str, Tensor], out: Path, dtype: torch.dtype | None
) -> None:
    """Build the HF model (`MODEL_CLASSES`) on the meta device, load the weights strictly (checks names and
    shapes) and save, with the remote code of a RePo model."""
    if dtype is not None:
        state_dict = {k: v.to(dtype) for k, v in state_dict.items()}
    with torch.device("meta"):
        model = MODEL_CLASSES[type(config)](config)
    expected = {
        k: v
        for k, v in model.state_dict().items()
        if not (config.tie_word_embeddings and k == "lm_head.weight")
    }
    check_state_dict(state_dict, expected, "HF model")
    model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    config.dtype = next(iter(state_dict.values())).dtype
    if config.model_type in REMOTE_CODE:
        config.auto_map = dict(AUTO_MAP[config.model_type])
        for name, source in REMOTE_CODE[config.model_type].items():
            shutil.copyfile(source, out / name)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id
    )
    model.save_pretrained(out)  # config.json, safetensors (sharded when large), generation_config.json


_META = ("model_type", "transformers_version", "architectures", "auto_map", "dtype", "torch_dtype")
"""Keys of a config.json that say how it is stored, not what the model is: the converted model's own."""
_STOCK_WINS = ("bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "max_window_layers")
"""Keys of the HF classes that no trainer's model config states: the tokenizer's ids (a run records the ids its data
were made with, e.g. no start id, one of several end ids), transformers' runtime switch, and Qwen 3's
`max_window_layers`, which transformers reads only to derive `layer_types` where a config has none (every converted
config states them): the release's statement (28 for 36 layers in Qwen3-8B) is kept."""
_SCORED_ONLY = tuple(key for key in SCORED_PE_KEYS if key not in PE_KEYS)
"""What a model's RePo layers score with (`pe_blend`, `pe_positions`), which no training config holds."""


def over_stock(
    config: PreTrainedConfig, stock: dict[str, Any] | None, max_position_embeddings: int | None = None
) -> PreTrainedConfig:
    """`config` (a trained model as its trainer's config says it; its `max_position_embeddings` the training
    length) over the config.json of the stock model the run continued (`stock`, as `carried` keeps it; None for a
    model trained from scratch): the stock model's context length (the longer of the two: the window a run trained
    on is not what the model can read), its token ids and every key the trainer's config does not state come back;
    what the weights compute (sizes, RoPE and its scaling, windows, RePo layers: the run's keys) stays the trained
    model's. `max_position_embeddings`, given, is the length outright. Changed in place and returned."""
    stock = stock or {}
    fields = {f.name for f in dataclasses.fields(type(config))}
    for key, value in stock.items():
        if (
            key not in _META
            and key not in PE_KEYS
            and (key not in fields or key in _STOCK_WINS + _SCORED_ONLY)
        ):
            setattr(config, key, value)
    config.max_position_embeddings = context_length(
        config.max_position_embeddings, stock, max_position_embeddings
    )
    return config


def tokenizer_beside(input: Path) -> Path | None:
    """The tokenizer.json of the HF directory `input`, which a converter to a trainer's checkpoint copies beside
    it; None where there is none, said in one line on stderr (both trainers' converters: the checkpoint then
    records no tokenizer, which the trainers' data checks and the conversion back to HF would say later)."""
    if (file := input / "tokenizer.json").is_file():
        return file
    print(
        f"{input} has no tokenizer.json: the checkpoint records no tokenizer (a run's config names its data's; "
        "converting it back to HF then takes --tokenizer)",
        file=sys.stderr,
    )
    return None


def context_length(trained: int, stock: dict[str, Any] | None, given: int | None = None) -> int:
    """A converted model's `max_position_embeddings` (`over_stock`): `given` outright, else the longer of the
    training length and the stock model's context (the window a run trained on is not what the model can read).
    A converter builds its config at this length from the start: transformers' RoPE validation warns of a Llama 3
    scaling whose original length is past the one it is built with."""
    return given or max(trained, (stock or {}).get("max_position_embeddings") or 0)


def as_stock(config: PreTrainedConfig) -> dict[str, Any]:
    """`config` whole, as JSON values: what a converter to a trainer's checkpoint records of the HF model."""
    return json.loads(config.to_json_string(use_diff=False))


def carried(stock: dict[str, Any]) -> dict[str, Any]:
    """The stock config a run carries into its checkpoints: without what the stock model's RePo layers scored
    with (`pe_blend`, `pe_positions`), which the run's own schedule and learned positions replace."""
    return {key: value for key, value in stock.items() if key not in _SCORED_ONLY}


def check_state_dict(state_dict: dict[str, Tensor], expected: dict[str, Tensor], what: str) -> None:
    """Keys and shapes of `state_dict` must be exactly those of `expected` (a meta-device model's)."""
    missing, unexpected = (
        sorted(expected.keys() - state_dict.keys()),
        sorted(state_dict.keys() - expected.keys()),
    )
    if missing or unexpected:
        raise KeyError(f"{what}: missing weights {missing[:8]}, unexpected weights {unexpected[:8]}")
    for key, tensor in state_dict.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"{what}: {key} has shape {tuple(tensor.shape)}, the config needs {tuple(expected[key].shape)}"
            )
