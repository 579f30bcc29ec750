"""`scripts/eval.py --backend vllm`: the same lm-eval tasks, prompts and scorer as `--backend hf`, run by
lm-eval's vLLM backend (`lm_eval.models.vllm_causallms.VLLM`) over this project's vLLM plugin.

YaRN is set as `olmo_repo.eval.loading.load_model` sets it for HF (the same `rope_parameters`, passed to vLLM
as `hf_overrides`), so RoPE layers and RePo positions see the same inverse frequencies and attention factor.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from .loading import read_config, yarn_overrides

__all__ = ["load_vllm", "release"]


def load_vllm(
    hf_dir: str | Path,
    length: int,
    yarn: str | float = "auto",
    dtype: str = "float32",
    batch_size: int = 8,
    enforce_eager: bool | None = None,
) -> Any:
    """lm-eval's vLLM model for `hf_dir` at a `length`-token context (YaRN per `yarn_factor`). Its `config`
    attribute is the HF config as vLLM runs it (with the YaRN override).

    `enforce_eager` (default: on CPU only): no torch.compile. On CPU compiling slows every engine's start (one
    per length) and its fused kernels round differently from HF's, which flips near-ties of greedy decoding on
    small models; eager outputs equal `--backend hf`'s (tests/vllm). GPUs compile, as vLLM does by default.
    """
    import torch

    if enforce_eager is None:
        enforce_eager = not torch.cuda.is_available()
    from ..upstream.vllm import lm_eval_vllm_class

    VLLM = lm_eval_vllm_class()
    overrides = yarn_overrides(read_config(hf_dir), length, yarn, source=f"{hf_dir}/config.json")
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


def release(lm: Any) -> None:
    """Shut down the engine of `load_vllm`, so that the next length can start one in this process."""
    from ..upstream.vllm import cleanup_dist_env_and_memory

    lm.model.llm_engine.engine_core.shutdown()
    gc.collect()
    cleanup_dist_env_and_memory()
