"""Hugging Face side of RePo. Importing this module registers `repo_olmo2` with transformers' Auto classes,
so `AutoModelForCausalLM.from_pretrained(dir)` loads a converted RePo checkpoint without remote code."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_repo_olmo2 import RepoOlmo2Config
from .modeling_repo_olmo2 import (
    RepoOlmo2CausalLMOutputWithPast,
    RepoOlmo2ForCausalLM,
    RepoOlmo2Model,
    RepoOlmo2ModelOutputWithPast,
    record_positions,
)

AutoConfig.register(RepoOlmo2Config.model_type, RepoOlmo2Config, exist_ok=True)
AutoModel.register(RepoOlmo2Config, RepoOlmo2Model, exist_ok=True)
AutoModelForCausalLM.register(RepoOlmo2Config, RepoOlmo2ForCausalLM, exist_ok=True)

__all__ = [
    "RepoOlmo2CausalLMOutputWithPast",
    "RepoOlmo2Config",
    "RepoOlmo2ForCausalLM",
    "RepoOlmo2Model",
    "RepoOlmo2ModelOutputWithPast",
    "record_positions",
]
