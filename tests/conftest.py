from __future__ import annotations

import os
from pathlib import Path

# Tests never download: set before anything imports huggingface_hub (which reads it once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import olmo_repo  # noqa: F401  (installs the block factory)
from olmo_repo import RepoModelConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def tiny_config(**overrides) -> RepoModelConfig:
    """An OLMo-2-shaped model (post-norm, RMS, q/k norms, no bias, SwiGLU) small enough for fp32 CPU tests."""
    kwargs = dict(
        d_model=64,
        n_heads=4,
        n_layers=4,
        mlp_ratio=4,
        rope=True,
        rope_theta=500_000,
        attention_layer_norm=True,
        norm_after=True,
        layer_norm_type="rms",
        layer_norm_eps=1e-6,
        bias_for_layer_norm=False,
        include_bias=False,
        weight_tying=False,
        attention_dropout=0.0,
        residual_dropout=0.0,
        embedding_dropout=0.0,
        max_sequence_length=64,
        vocab_size=100,
        embedding_size=128,
        eos_token_id=0,
        pad_token_id=1,
        init_device="cpu",
        init_fn="normal",
        init_std=0.02,
        init_cutoff_factor=3,
    )
    kwargs.update(overrides)
    return RepoModelConfig(**kwargs)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
