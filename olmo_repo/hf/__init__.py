"""Hugging Face side of RePo (transformers and torch only, no ai2-olmo).

Importing this module registers `repo_olmo2`, `repo_olmo3` (OLMo 3's sliding windows), `repo_llama` and
`repo_qwen3` (transformers' Llama and Qwen 3 with the same RePo attention) with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` loads a RePo checkpoint without remote code.

It also routes the reference implementation's format (`model_type: olmo2` with a nested `pe_config`): stock
transformers would build a stock Olmo2 from it and drop the RePo weights. After this import,
`AutoModelForCausalLM`/`AutoModel` build `RepoOlmo2ForCausalLM`/`RepoOlmo2Model` for such a config and the
stock classes, unchanged, for every other `olmo2` config (`olmo_repo.upstream.transformers.olmo2_or_reference`),
and `RepoOlmo2Config.from_pretrained` reads it too: all through the one reader, `olmo_repo.hf.formats`.
"""

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Olmo2Config, PreTrainedModel
from transformers.models.olmo2.modeling_olmo2 import Olmo2ForCausalLM, Olmo2Model

from ..dtypes import DTYPE_NAMES
from ..rope import record_positions
from ..upstream.transformers import olmo2_or_reference
from .configuration_repo_llama import RepoLlamaConfig
from .configuration_repo_olmo2 import RepoOlmo2Config
from .configuration_repo_olmo3 import RepoOlmo3Config
from .configuration_repo_qwen3 import RepoQwen3Config
from .formats import hub_kwargs, read_hf_config, read_reference, reference_config, weight_shapes
from .modeling_repo_llama import RepoLlamaForCausalLM, RepoLlamaModel
from .modeling_repo_olmo2 import (
    RepoCausalLMOutputWithPast,
    RepoModelOutputWithPast,
    RepoOlmo2ForCausalLM,
    RepoOlmo2Model,
)
from .modeling_repo_olmo3 import RepoOlmo3ForCausalLM, RepoOlmo3Model
from .modeling_repo_qwen3 import RepoQwen3ForCausalLM, RepoQwen3Model


def _reference_config(config: Olmo2Config, shapes: Any, source: str) -> RepoOlmo2Config:
    return reference_config(config.to_dict(), shapes, source)


def _weight_shapes(path: Any, **kwargs: Any) -> Any:
    return weight_shapes(path, **hub_kwargs(kwargs))


# The registration this import does (see the module docstring).
RepoOlmo2Config.reference_reader = read_reference
for _config, _model, _causal_lm in (
    (RepoOlmo2Config, RepoOlmo2Model, RepoOlmo2ForCausalLM),
    (RepoOlmo3Config, RepoOlmo3Model, RepoOlmo3ForCausalLM),
    (RepoLlamaConfig, RepoLlamaModel, RepoLlamaForCausalLM),
    (RepoQwen3Config, RepoQwen3Model, RepoQwen3ForCausalLM),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _causal_lm, exist_ok=True)
for _auto, _stock, _repo in (
    (AutoModel, Olmo2Model, RepoOlmo2Model),
    (AutoModelForCausalLM, Olmo2ForCausalLM, RepoOlmo2ForCausalLM),
):
    _auto.register(
        Olmo2Config, olmo2_or_reference(_stock, _repo, _reference_config, _weight_shapes), exist_ok=True
    )

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
"""The dtypes a converted model can be written and loaded in, by name."""


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The attention of every decoder layer of `model` (a causal LM or its decoder), in layer order: each
    layer's `self_attn`, where every family here has it (OLMo 2/3, Llama, Qwen 3, stock or RePo) and where the
    RePo decoder layers build theirs (`RepoDecoderLayerMixin`). Each returns (output [B, T, d], weights [B, H, T, T]
    under eager attention, one row per query head, else None)."""
    return [layer.self_attn for layer in model.base_model.layers]


__all__ = [
    "DTYPES",
    "RepoCausalLMOutputWithPast",
    "RepoLlamaConfig",
    "RepoLlamaForCausalLM",
    "RepoLlamaModel",
    "RepoModelOutputWithPast",
    "RepoOlmo2Config",
    "RepoOlmo2ForCausalLM",
    "RepoOlmo2Model",
    "RepoOlmo3Config",
    "RepoOlmo3ForCausalLM",
    "RepoOlmo3Model",
    "RepoQwen3Config",
    "RepoQwen3ForCausalLM",
    "RepoQwen3Model",
    "attention_modules",
    "read_hf_config",
    "record_positions",
]
