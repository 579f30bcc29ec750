"""Small OLMo-core configs and tolerances for the OLMo-core tests (fp32 on CPU)."""

from __future__ import annotations

import math

import pytest
import torch
from olmo_core.nn.transformer import TransformerConfig
from torch import Tensor

from olmo_repo.olmocore.attention import with_position_modes

__all__ = ["assert_within", "needs_gqa", "olmo2_tiny"]


def _gqa_allowed() -> bool:
    from olmo_repo.modes import check_position_modes

    try:
        check_position_modes("repo", 0, None, n_layers=1, n_heads=4, n_kv_heads=2)
    except ValueError:
        return False
    return True


needs_gqa = pytest.mark.skipif(
    not _gqa_allowed(), reason="RePo with GQA: the core lifts the refusal (issue 28)"
)


def olmo2_tiny(
    pe_mode: str = "repo", pe_start_layer: int = 1, pe_layer_ids: list[int] | None = None, **kwargs
) -> TransformerConfig:
    """An Olmo-2-shaped OLMo-core config (OLMo-core's `olmo2_*` presets in small) with position modes."""
    base = dict(
        vocab_size=100,
        d_model=64,
        n_layers=4,
        n_heads=4,
        block_name="reordered_norm",
        qk_norm=True,
        rope_theta=500_000,
        layer_norm_eps=1e-6,
        hidden_size_multiplier=1.5,
    )
    config = TransformerConfig.llama_like(**{**base, **kwargs})
    return with_position_modes(config, pe_mode, pe_start_layer, pe_layer_ids)


def assert_within(actual: Tensor, truth: Tensor, *, roundings: float, what: str = "result") -> None:
    """|actual - truth| <= roundings * eps(actual's dtype) * max|truth| (tests/numerics.py's bound, which the
    main suite's environment holds; this environment has no ai2-olmo to import it with)."""
    assert actual.shape == truth.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(truth.shape)}"
    eps = torch.finfo(actual.dtype).eps
    truth = truth.detach().double()
    bound = roundings * eps * truth.abs().max().item()
    error = (actual.detach().double() - truth).abs().max().item()
    assert error <= bound and not math.isnan(error), (
        f"{what}: max |actual - truth| = {error:.3g} exceeds {roundings:.0f} roundings x eps {eps:.3g} x "
        f"magnitude = {bound:.3g}"
    )
