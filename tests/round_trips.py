"""Whole-config comparison of conversion round trips (both environments): everything a config holds must come
back equal, but for the keys listed here, each with the reason it may differ."""

from __future__ import annotations

from typing import Any

from olmo_repo.modes import PE_KEYS

__all__ = ["ALL_ROPE_MAY_DIFFER", "CORE_MAY_DIFFER", "HF_MAY_DIFFER", "OLMO_MAY_DIFFER", "config_differences"]

HF_MAY_DIFFER: dict[str, str] = {}
"""HF config.json keys (dotted) a round trip through a trainer's checkpoint may change."""

OLMO_MAY_DIFFER: dict[str, str] = {
    "mlp_hidden_size": "ai2-olmo sizes the MLP by mlp_ratio x d_model or by mlp_hidden_size; from HF's "
    "intermediate_size it is stated as mlp_hidden_size (the tests compare the resolved width)",
}
"""ai2-olmo `model` config keys a round trip through HF may change."""

CORE_MAY_DIFFER: dict[str, str] = {
    "dataset.tokenizer.identifier": "the tokenizer is copied into every converted checkpoint and named there",
    "hf_config": "a checkpoint converted from HF records the HF model's config (what the conversion back keeps "
    "of it); one trained here from scratch has none",
    "model.block.sequence_mixer.sliding_window.force_full_attention_on_last_layer": "HF states the window of "
    "every layer (layer_types), OLMo-core a pattern and flags: the same windows may be said either way (the "
    "tests compare every layer's resolved window)",
}
"""OLMo-core checkpoint config.json keys a round trip through HF may change."""

ALL_ROPE_MAY_DIFFER: dict[str, str] = {
    f"model.block.sequence_mixer.{key}": "a model without RePo or NoPE layers is a stock one: HF olmo2/olmo3, "
    "back to OLMo-core's own AttentionConfig, the same computation"
    for key in ("_CLASS_", "type", *PE_KEYS)
}
"""OLMo-core keys that may also differ for a model whose every layer is RoPE, and only for it."""


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(
    first: dict[str, Any], second: dict[str, Any], may_differ: dict[str, str]
) -> dict[str, Any]:
    """{dotted key: (first's value, second's)} for every value that differs, but for the keys (and what is
    below them) `may_differ` lists."""
    a, b = _flat(first), _flat(second)

    def listed(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in may_differ)

    keys = sorted(a.keys() | b.keys())
    return {
        k: (a.get(k, "<absent>"), b.get(k, "<absent>"))
        for k in keys
        if a.get(k, "<absent>") != b.get(k, "<absent>") and not listed(k)
    }
