"""Which position mode each layer of a vLLM-loaded checkpoint has, read as `olmo_repo.hf` reads it."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig

from ..hf.configuration_repo_llama import RepoLlamaConfig
from ..hf.configuration_repo_olmo2 import RepoOlmo2Config
from ..hf.configuration_repo_olmo3 import RepoOlmo3Config
from ..hf.configuration_repo_qwen3 import RepoQwen3Config
from ..hf.formats import check_f_phi, reference_config, weight_shapes
from ..upstream.vllm import VerifyAndUpdateConfig, cpu_attention_takes

__all__ = ["ARCHITECTURES", "REPO_MODEL_TYPES", "RepoConfigCheck", "check_head_size", "repo_config"]

_OLMO = "olmo_repo.vllm.model:RepoOlmo2ForCausalLM"
ARCHITECTURES = {
    "RepoOlmo2ForCausalLM": _OLMO,
    "Olmo2ForCausalLM": _OLMO,
    "RepoOlmo3ForCausalLM": _OLMO,
    "RepoLlamaForCausalLM": "olmo_repo.vllm.families:RepoLlamaForCausalLM",
    "RepoQwen3ForCausalLM": "olmo_repo.vllm.families:RepoQwen3ForCausalLM",
}
"""The architectures the plugin serves -> its vLLM model class, as a "module:Class" string (vLLM imports the
model lazily, after it has chosen its device)."""
REPO_MODEL_TYPES = tuple(
    c.model_type for c in (RepoOlmo2Config, RepoOlmo3Config, RepoLlamaConfig, RepoQwen3Config)
)
"""This project's HF model types, whose configs carry the RePo keys themselves."""


def repo_config(hf_config: PretrainedConfig, model: str) -> PretrainedConfig:
    """`hf_config` as a config with the RePo keys: this project's (`REPO_MODEL_TYPES`) as is (also their
    remote-code copies), the reference's `olmo2` + `pe_config` translated, stock Olmo2 as a `repo_olmo2`
    config whose layers are all RoPE; f_phi's weights in `model` checked against it, and the position keys,
    `hf_overrides` included. Raises ValueError naming the key or weight vLLM cannot run."""
    shapes = weight_shapes(model)
    if getattr(hf_config, "pe_config", None) is not None:
        return reference_config(hf_config.to_dict(), shapes, str(model))
    config = hf_config
    if hf_config.model_type not in REPO_MODEL_TYPES:
        config_dict: dict[str, Any] = {k: v for k, v in hf_config.to_dict().items() if k != "architectures"}
        config = RepoOlmo2Config.from_dict({**config_dict, "model_type": RepoOlmo2Config.model_type})
    check_f_phi(shapes, config, str(model))
    # Keys set after the config was made (vLLM's `hf_overrides`: `pe_blend`, `pe_positions`) are checked here.
    config.validate_position_modes()
    if config.model_type == RepoQwen3Config.model_type and len(set(config.layer_types or ())) > 1:
        # vLLM's Qwen 3 model refuses this too (`Qwen2Model.__init__`): one window from the cache config for
        # every layer. The plugin builds Qwen 3 on Llama's model, which does not check it.
        raise ValueError(
            f"{model}: layer_types mixes sliding-window and full attention (use_sliding_window with "
            "max_window_layers < num_hidden_layers), which vLLM's Qwen 3 does not run"
        )
    return config


def check_head_size(hf_config: PretrainedConfig, model: str, dtype: torch.dtype) -> None:
    """ValueError naming the head size when vLLM runs on the CPU and its attention has no kernel for it
    (`cpu_attention_takes`): said before an engine starts, where vLLM says it after start-up."""
    from vllm.platforms import current_platform

    head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    if current_platform.is_cpu() and not cpu_attention_takes(head, dtype):
        raise ValueError(
            f"{model}: head size {head} has no kernel in vLLM's CPU attention ({str(dtype).removeprefix('torch.')}; "
            "32, 48, 64, 128 and others have one): evaluate it with --backend hf, or run vLLM on a GPU"
        )


class RepoConfigCheck(VerifyAndUpdateConfig):
    """Run by vLLM while it builds its ModelConfig: refuse what the model class could not build, or what its
    CPU attention could not run."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        repo_config(model_config.hf_config, model_config.model)
        check_head_size(model_config.hf_config, model_config.model, model_config.dtype)
