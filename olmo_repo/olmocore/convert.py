"""OLMo-core <-> Hugging Face configs and weight names for the families of `olmo_repo.olmocore.families` (Olmo 2,
Olmo 3, Llama, Qwen 3; stock or RePo), one mechanism for all, nothing dropped or guessed.

A config goes through its family's table, a `Row` per HF key read by both directions; an OLMo-core config is
first checked for everything its family's block fixes (`check_shape`). Weights go through OLMo-core's own state
converters (`olmo_core.nn.hf.convert`, asked by the family's model type, which names the norms); the weights
those do not map (f_phi's, the attention biases: `SIDE_KEYS`) are taken out before and put back renamed. Every
key of the input must map, else one error names the keys.
"""

from __future__ import annotations

import dataclasses
from functools import reduce
from typing import Any

from olmo_core.config import DType
from olmo_core.nn.attention import AttentionConfig, AttentionType
from olmo_core.nn.conversion.state_converter import StateConverter
from olmo_core.nn.conversion.state_mapping import TemplatePlaceholder
from olmo_core.nn.feed_forward import ActivationFunction, FeedForwardType
from olmo_core.nn.hf.convert import get_converter_from_hf, get_converter_to_hf
from olmo_core.nn.layer_norm import LayerNormType
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from torch import Tensor
from transformers import PreTrainedConfig

from ..modes import F_PHI_WEIGHTS, PE_KEYS, PositionMode, layer_modes
from .attention import RepoAttentionConfig, with_position_modes
from .families import (
    FAMILIES,
    LLAMA,
    OLMO2,
    OLMO3,
    QWEN3,
    Family,
    ShapeError,
    has_bias,
    sliding_layers,
)

__all__ = [
    "SIDE_KEYS",
    "check_shape",
    "core_config_from_hf",
    "family_config_from_hf",
    "family_of",
    "family_of_core",
    "hf_config_from_core",
    "state_from_hf",
    "state_to_hf",
]


def family_of(hf: PreTrainedConfig) -> Family:
    """The family of an HF config, stock or RePo."""
    for family in FAMILIES:
        if isinstance(hf, family.stock):
            return family
    allowed = ", ".join(f"{f.stock.model_type}, {f.repo.model_type}" for f in FAMILIES)
    raise ValueError(f"config.json: model_type={hf.model_type!r} has no OLMo-core family; allowed: {allowed}")


def family_of_core(config: TransformerConfig) -> Family:
    """The family an OLMo-core config converts to: Llama for a default (pre-norm) block without q/k norms, Qwen 3
    with per-head ones; else Olmo 3 where a layer slides, or Olmo 2 (whose checks name what differs)."""
    block = config.block
    if isinstance(block, dict) or not isinstance(block.sequence_mixer, AttentionConfig):
        return OLMO2
    att = block.sequence_mixer
    if block.name == TransformerBlockType.default:
        if att.qk_norm is None:
            return LLAMA
        if att.use_head_qk_norm and not att.qk_norm_per_head_gains:
            return QWEN3
    return OLMO3 if sliding_layers(config) else OLMO2


def family_config_from_hf(
    family: Family, hf: PreTrainedConfig, dtype: DType = DType.float32
) -> TransformerConfig:
    """OLMo-core's config of an HF config of `family`: OLMo-core's `llama_like` with the family's block, norms
    and RoPE precision (HF's rounding order), every other value from the family's table; position modes for a
    RePo config."""
    for key, value in family.hf_fixed.items():
        if getattr(hf, key, value) != value:
            raise ValueError(
                f"config.json: {key}={getattr(hf, key)!r} has no OLMo-core counterpart; allowed: {value!r}"
            )
    arguments: dict[str, Any] = {}
    for row in family.rows:
        arguments.update(row.to_core(hf))
    paths = {k: arguments.pop(k) for k in list(arguments) if "." in k}
    arguments["feed_forward"] = dataclasses.replace(arguments["feed_forward"], dtype=dtype)
    config = TransformerConfig.llama_like(
        **arguments,
        block_name=family.block,
        layer_norm_name=family.layer_norm,
        rope_full_precision=family.rope_full_precision,
        qk_norm=family.qk_norm,
        use_head_qk_norm=family.head_qk_norm,
        dtype=dtype,
    )
    for path, value in paths.items():
        *parents, last = path.split(".")
        setattr(reduce(getattr, parents, config), last, value)
    if isinstance(hf, family.repo):
        # the layers' modes and the index blend's schedule, which a new run starts again at step 0
        config = with_position_modes(config, **{key: getattr(hf, key) for key in PE_KEYS})
    return config


def core_config_from_hf(hf: PreTrainedConfig, dtype: DType = DType.float32) -> TransformerConfig:
    """The OLMo-core `TransformerConfig` of an HF config of any family (its position modes and sliding windows
    included)."""
    return family_config_from_hf(family_of(hf), hf, dtype)


def check_shape(family: Family, config: TransformerConfig) -> AttentionConfig:
    """The block's attention config, after checking every key of `config` that `family` fixes beyond its rows;
    ShapeError naming the first that differs."""
    if isinstance(config.block, dict) or config.block_pattern or config.block_overrides:
        raise ShapeError("block_overrides", "set", "one block config for every layer")
    block, att, head = config.block, config.block.sequence_mixer, config.lm_head
    if block.name != family.block:
        raise ShapeError("block.name", block.name, family.block)
    if not isinstance(att, AttentionConfig) or att.name != AttentionType.default:
        raise ShapeError("block.sequence_mixer.name", getattr(att, "name", att), "default attention")
    for key, value in (("block.feed_forward", block.feed_forward), ("lm_head.layer_norm", head.layer_norm)):
        if value is None:
            raise ShapeError(key, value, "set: a SwiGLU feed-forward and a final RMS norm")
    norms = (LayerNormType.rms, LayerNormType.fused_rms, family.layer_norm)
    ff, qk = block.feed_forward, att.qk_norm
    checks = {
        "block.layer_norm.name": (block.layer_norm.name, block.layer_norm.name in norms),
        "block.layer_norm.bias": (block.layer_norm.bias, not has_bias(block.layer_norm.bias)),
        "lm_head.layer_norm.name": (head.layer_norm.name, head.layer_norm.name in norms),
        "lm_head.layer_norm.bias": (head.layer_norm.bias, not has_bias(head.layer_norm.bias)),
        "block.sequence_mixer.qk_norm": (
            qk,
            (qk is not None) == family.qk_norm and bool(att.use_head_qk_norm) == family.head_qk_norm,
        ),
        "block.sequence_mixer.qk_norm.name": (
            qk and qk.name,
            qk is None or (qk.name in norms and not has_bias(qk.bias)),
        ),
        "block.sequence_mixer.gate": (att.gate, att.gate is None),
        "block.sequence_mixer.clip_qkv": (att.clip_qkv, att.clip_qkv is None),
        "block.sequence_mixer.dropout": (att.dropout, not att.dropout),
        "block.sequence_mixer.scalable_softmax": (att.scalable_softmax, not att.scalable_softmax),
        "block.sequence_mixer.attention_sinks": (att.attention_sinks, not att.attention_sinks),
        "block.feed_forward_moe": (block.feed_forward_moe, block.feed_forward_moe is None),
        "block.feed_forward.name": (ff.name, ff.name == FeedForwardType.default),
        "block.feed_forward.bias": (ff.bias, not has_bias(ff.bias)),
        "block.feed_forward.activation": (ff.activation, ff.activation == ActivationFunction.silu),
        "block.dropout": (block.dropout, not block.dropout),
        "embedding_norm": (config.embedding_norm, config.embedding_norm is None),
        "embed_scale": (config.embed_scale, config.embed_scale is None),
        "lm_head.bias": (head.bias, not has_bias(head.bias)),
    }
    for key, (value, ok) in checks.items():
        if not ok:
            raise ShapeError(key, value, "the value of the HF model")
    return att


def hf_config_from_core(
    config: TransformerConfig,
    *,
    eos_token_id: int | None,
    pad_token_id: int | None,
    bos_token_id: int | None = None,
    max_position_embeddings: int = 4096,
    pe_blend: float = 0.0,
) -> PreTrainedConfig:
    """The HF config of an OLMo-core model (`family_of_core`): the family's stock config if every layer is RoPE,
    else its RePo config, whose `pe_blend` is the index blend's p the RePo layers score with (the schedule's at
    the checkpoint's step). Raises ValueError naming the first key that is not the family's."""
    family = family_of_core(config)
    try:
        att = check_shape(family, config)
        values: dict[str, Any] = dict(family.hf_fixed)
        for row in family.rows:
            values.update(row.to_hf(config))
    except ShapeError as e:
        raise ValueError(f"model.{e.key}={e.value}: " + family.refusal.format(needs=e.needs)) from None
    values.update(
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        max_position_embeddings=max_position_embeddings,
    )
    if not any(mode != PositionMode.rope for mode in layer_modes(att, n_layers=config.n_layers)):
        return family.stock(**values)
    assert isinstance(att, RepoAttentionConfig)
    # `modes.PE_KEYS` as recorded, and the p the model scores with
    keys = {**{key: getattr(att, key) for key in PE_KEYS}, "pe_mode": str(att.pe_mode), "pe_blend": pe_blend}
    return family.repo(**values, **keys)


# ---------------------------------------------------------------------------------------------- weights


SIDE_KEYS = {
    **{
        f"blocks.{{layer}}.attention.w_{core}.bias": f"model.layers.{{layer}}.self_attn.{hf}_proj.bias"
        for core, hf in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))
    },
    **{
        f"blocks.{{layer}}.attention.{name}.weight": f"model.layers.{{layer}}.self_attn.{name}.weight"
        for name in F_PHI_WEIGHTS
    },
}
"""OLMo-core name -> HF name of the weights OLMo-core's state converters (3.0.0) leave out: the attention biases
(Llama's and Qwen 3's attention_bias) and f_phi's (RePo layers)."""


def _side_keys(n_layers: int) -> dict[str, str]:
    return {c.format(layer=i): h.format(layer=i) for i in range(n_layers) for c, h in SIDE_KEYS.items()}


def _convert(
    converter: StateConverter, state: dict[str, Tensor], side: dict[str, str], n_layers: int, what: str
) -> dict[str, Tensor]:
    """`state` renamed by OLMo-core's `converter`, and its `side` keys (name -> new name) beside; the same values
    (the converter copies each tensor)."""
    try:
        out = converter.convert(
            {k: v for k, v in state.items() if k not in side}, {TemplatePlaceholder.LAYER: n_layers}
        )
    except RuntimeError as e:  # "Some state keys were not converted: [...]"
        raise ValueError(f"{what} has weights with no counterpart ({e})") from None
    return {**out, **{side[k]: v for k, v in state.items() if k in side}}


def state_from_hf(hf: PreTrainedConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An HF state dict -> OLMo-core names, the values as they are (a tied output layer under both names)."""
    side = {h: c for c, h in _side_keys(hf.num_hidden_layers).items()}
    converter = get_converter_from_hf(family_of(hf).core_model_type)
    out = _convert(converter, state, side, hf.num_hidden_layers, "the Hugging Face model")
    if hf.tie_word_embeddings:
        out["lm_head.w_out.weight"] = out["embeddings.weight"]
    return out


def state_to_hf(hf: PreTrainedConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An OLMo-core state dict -> the HF names of `hf` (the converted config), the values as they are; a tied
    output layer is left out."""
    if hf.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.w_out.weight"}
    converter = get_converter_to_hf(family_of(hf).core_model_type)
    return _convert(
        converter, state, _side_keys(hf.num_hidden_layers), hf.num_hidden_layers, "the OLMo-core model"
    )
