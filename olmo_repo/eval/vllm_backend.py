"""`scripts/eval.py --backend vllm`: the same lm-eval tasks, prompts and scorer as `--backend hf`, run by
lm-eval's vLLM backend (`lm_eval.models.vllm_causallms.VLLM`) over this project's vLLM plugin.

YaRN and the replaced positions (`--positions`) are set as `olmo_repo.eval.loading.load_model` sets them for HF
(the same `rope_parameters` and `pe_positions`, passed to vLLM as `hf_overrides`), so RoPE layers and RePo
positions see the same inverse frequencies and attention factor, and RePo layers rotate by what HF's do.
"""

from __future__ import annotations

import gc
import math
import os
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from ..modes import PositionSource
from .loading import position_overrides, read_config, yarn_overrides

__all__ = ["kv_cache_gib", "load_vllm", "release"]


def load_vllm(
    hf_dir: str | Path,
    length: int,
    yarn: str | float = "auto",
    dtype: str = "float32",
    batch_size: int = 8,
    enforce_eager: bool | None = None,
    positions: str = PositionSource.learned,
) -> Any:
    """lm-eval's vLLM model for `hf_dir` at a `length`-token context (YaRN per `yarn_factor`), its RePo layers
    rotating by `positions` (`position_overrides`). Its `config` attribute is the HF config as vLLM runs it (with
    the overrides).

    `enforce_eager` (default: on CPU only): no torch.compile. On CPU compiling slows every engine's start (one
    per length) and its fused kernels round differently from HF's, which flips near-ties of greedy decoding on
    small models; eager outputs equal `--backend hf`'s (tests/vllm). GPUs compile, as vLLM does by default.
    """
    import torch

    if enforce_eager is None:
        enforce_eager = not torch.cuda.is_available()
    from ..upstream.vllm import lm_eval_vllm_class
    from ..vllm.config import check_head_size

    VLLM = lm_eval_vllm_class()
    config = read_config(hf_dir)
    check_head_size(config, str(hf_dir), getattr(torch, dtype, torch.float32))  # before the engine starts
    source = f"{hf_dir}/config.json"
    overrides = yarn_overrides(config, length, yarn, source) | position_overrides(config, positions, source)
    if not torch.cuda.is_available() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        # vLLM on CPU otherwise asks for 92% of the machine's memory and refuses to start when less is free
        # (`Available memory ... is less than desired CPU memory utilization`): reserve what the batch needs.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib(config, length, batch_size, dtype))
    lm = VLLM(
        pretrained=str(hf_dir),
        dtype=dtype,
        max_length=length,
        batch_size=batch_size,
        max_num_seqs=batch_size,
        seed=0,
        hf_overrides=overrides or None,
        enforce_eager=enforce_eager,
    )
    lm.config = AutoConfig.from_pretrained(hf_dir, **overrides)
    return lm


def kv_cache_gib(config: Any, length: int, batch_size: int, dtype: str) -> int:
    """GiB of KV cache for `batch_size` sequences of `length` tokens of the model `config` (keys and values of
    every layer and key/value head), rounded up, plus 1 GiB of headroom: what `load_vllm` reserves on CPU."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = 4 if dtype in ("float32", "auto") else 2
    per_token = 2 * config.num_hidden_layers * heads * head_dim * width
    return math.ceil(per_token * length * batch_size / 2**30) + 1


def release(lm: Any) -> None:
    """Shut down the engine of `load_vllm`, so that the next length can start one in this process."""
    from ..upstream.vllm import cleanup_dist_env_and_memory

    lm.model.llm_engine.engine_core.shutdown()
    gc.collect()
    cleanup_dist_env_and_memory()
