"""RePo on stock vLLM, through its plugin entry point (`vllm.general_plugins` -> `olmo_repo.vllm:register`).

vLLM calls `register()` in every process it starts. It routes the architectures this project's checkpoints
carry to native vLLM models (`ARCHITECTURES`):

- `RepoOlmo2ForCausalLM`, `RepoOlmo3ForCausalLM` -> `olmo_repo.vllm.model.RepoOlmo2ForCausalLM`: this
  project's HF formats (`model_type: repo_olmo2`, and `repo_olmo3` with OLMo 3's sliding windows; with or
  without remote code);
- `Olmo2ForCausalLM` -> the same: the reference's format (`olmo2` + `pe_config`) and stock Olmo2, which has
  every layer RoPE (stock vLLM 0.32 runs Olmo2 on its Transformers backend; the plugin runs it natively);
- `RepoLlamaForCausalLM`, `RepoQwen3ForCausalLM` -> `olmo_repo.vllm.families`: `repo_llama` and `repo_qwen3`,
  vLLM's Llama and Qwen 3 with the same RePo attention step.

A config check runs while vLLM builds its ModelConfig, in the caller's process: a checkpoint it cannot run
(the reference's `cope` mode, head counts that do not divide, an f_phi of another model, a `pe_config` that
disagrees with the weights) is refused there, with one line naming the key, before any engine starts.
"""

from __future__ import annotations

from .config import ARCHITECTURES, repo_config

__all__ = ["ARCHITECTURES", "register", "repo_config"]


def register() -> None:
    """The `vllm.general_plugins` entry point: register the model classes and the config check with vLLM."""
    from vllm import ModelRegistry

    import olmo_repo.hf  # noqa: F401  (registers this project's model types with transformers' AutoConfig)

    from ..upstream.vllm import register_config_check
    from .config import RepoConfigCheck

    for arch, model_class in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, model_class)  # "module:Class": imported lazily by vLLM
        register_config_check(arch, RepoConfigCheck)
