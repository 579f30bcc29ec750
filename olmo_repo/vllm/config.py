"""Which position mode each layer of a vLLM-loaded checkpoint has, read as `olmo_repo.hf` reads it."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from ..hf.configuration_repo_olmo2 import RepoOlmo2Config
from ..hf.formats import from_reference, weight_names
from ..upstream.vllm import VerifyAndUpdateConfig

__all__ = ["ARCHITECTURES", "RepoConfigCheck", "repo_config"]

ARCHITECTURES = ("RepoOlmo2ForCausalLM", "Olmo2ForCausalLM")


def repo_config(hf_config: PretrainedConfig, model: str) -> PretrainedConfig:
    """`hf_config` as a config with the RePo keys: this project's config as is (also its remote-code copy),
    the reference's `olmo2` + `pe_config` translated (and checked against the weights in `model`), stock
    Olmo2 as a `repo_olmo2` config whose layers are all RoPE. Raises ValueError naming the key vLLM cannot
    run."""
    if hf_config.model_type == RepoOlmo2Config.model_type:
        return hf_config
    config_dict: dict[str, Any] = hf_config.to_dict()
    if getattr(hf_config, "pe_config", None) is not None:
        config_dict = from_reference(config_dict, weight_names(model), str(model))
    else:
        config_dict = {k: v for k, v in config_dict.items() if k != "architectures"}
        config_dict["model_type"] = RepoOlmo2Config.model_type
    return RepoOlmo2Config.from_dict(config_dict)


class RepoConfigCheck(VerifyAndUpdateConfig):
    """Run by vLLM while it builds its ModelConfig: refuse what the model class could not build."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        repo_config(model_config.hf_config, model_config.model)
