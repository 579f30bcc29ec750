"""Small OLMo-core configs and tolerances for the OLMo-core tests (fp32 on CPU)."""

from __future__ import annotations

from olmo_core.nn.transformer import TransformerConfig

from olmo_repo.olmocore.attention import with_position_modes

from ..bounds import assert_within

__all__ = ["assert_within", "logit_roundings", "olmo2_tiny"]


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
    return with_position_modes(config, pe_mode, pe_start_layer=pe_start_layer, pe_layer_ids=pe_layer_ids)


def logit_roundings(config: TransformerConfig, seq_len: int) -> int:
    """Worst-case rounding count of the logits of an Olmo-2-shaped model (tests/numerics.py's count)."""
    d, hidden = config.d_model, config.block.feed_forward.hidden_size
    block = 8 * d + d // config.block.sequence_mixer.n_heads + seq_len + hidden + d // 8
    return config.n_layers * block + 2 * d
