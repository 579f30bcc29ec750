"""Which position mode each layer of a vLLM-loaded checkpoint has, read as `olmo_repo.hf` reads it."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from ..hf.configuration_repo_olmo2 import RepoOlmo2Config
from ..hf.configuration_repo_olmo3 import RepoOlmo3Config
from ..hf.formats import check_f_phi, reference_config, weight_shapes
from ..upstream.vllm import VerifyAndUpdateConfig

__all__ = ["ARCHITECTURES", "RepoConfigCheck", "repo_config"]

ARCHITECTURES = ("RepoOlmo2ForCausalLM", "Olmo2ForCausalLM", "RepoOlmo3ForCausalLM")


def repo_config(hf_config: PretrainedConfig, model: str) -> PretrainedConfig:
    """`hf_config` as a config with the RePo keys: this project's (`repo_olmo2`, `repo_olmo3`) as is (also
    their remote-code copies), the reference's `olmo2` + `pe_config` translated, stock Olmo2 as a `repo_olmo2`
    config whose layers are all RoPE; f_phi's weights in `model` checked against it. Raises ValueError naming the key or weight vLLM
    cannot run."""
    shapes = weight_shapes(model)
    if getattr(hf_config, "pe_config", None) is not None:
        return reference_config(hf_config.to_dict(), shapes, str(model))
    config = hf_config
    if hf_config.model_type not in (RepoOlmo2Config.model_type, RepoOlmo3Config.model_type):
        config_dict: dict[str, Any] = {k: v for k, v in hf_config.to_dict().items() if k != "architectures"}
        config = RepoOlmo2Config.from_dict({**config_dict, "model_type": RepoOlmo2Config.model_type})
    check_f_phi(shapes, config, str(model))
    return config


class RepoConfigCheck(VerifyAndUpdateConfig):
    """Run by vLLM while it builds its ModelConfig: refuse what the model class could not build."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        repo_config(model_config.hf_config, model_config.model)
