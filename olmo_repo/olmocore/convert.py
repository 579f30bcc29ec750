"""OLMo-core <-> Hugging Face for the Olmo 2 and Olmo 3 shapes: configs and weight names, nothing dropped or
guessed.

The Olmo 2 shape (OLMo-core's `olmo2_*` presets; the OLMo 2 checkpoints) is a `reordered_norm` block with RMS
norms, full-width q/k norms, SwiGLU and no biases. In Hugging Face it is `olmo2` (every layer RoPE) or this
project's `repo_olmo2` (`olmo_repo.hf`: a position mode per layer, RePo weights under the same names). The
Olmo 3 shape (`olmo3_*` presets) is the same block with sliding-window attention in some layers (OLMo-core's
`sliding_window` pattern); in Hugging Face `olmo3` or `repo_olmo3`, whose `layer_types` list each layer's
attention and whose `sliding_window` is OLMo-core's window size (both count the token itself: OLMo-core hands
flash attention `window_size - 1`). Weight names are the same in both. The maps below are one-to-one, with `{layer}`
placeholders as OLMo-core's own key maps have; every key of the input must map and every key of the target
must be filled, else one error names the keys.
"""

from __future__ import annotations

from typing import Any

from olmo_core.config import DType
from olmo_core.nn.attention import AttentionConfig, AttentionType, SlidingWindowAttentionConfig
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.layer_norm import LayerNormType
from olmo_core.nn.rope import PIRoPEScalingConfig, RoPEType, YaRNRoPEScalingConfig
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from torch import Tensor
from transformers import Olmo2Config, Olmo3Config, PreTrainedConfig

from ..hf import RepoOlmo2Config, RepoOlmo3Config
from ..modes import F_PHI_WEIGHTS, PositionMode, layer_modes
from .attention import RepoAttentionConfig, with_position_modes

__all__ = [
    "LAYER_KEYS",
    "MODEL_KEYS",
    "core_config_from_hf",
    "core_state_from_hf",
    "hf_config_from_core",
    "hf_state_from_core",
]

MODEL_KEYS = {
    "embeddings.weight": "model.embed_tokens.weight",
    "lm_head.norm.weight": "model.norm.weight",
    "lm_head.w_out.weight": "lm_head.weight",
}
"""OLMo-core name -> HF name, outside the blocks."""

LAYER_KEYS = {
    "blocks.{layer}.attention.w_q.weight": "model.layers.{layer}.self_attn.q_proj.weight",
    "blocks.{layer}.attention.w_k.weight": "model.layers.{layer}.self_attn.k_proj.weight",
    "blocks.{layer}.attention.w_v.weight": "model.layers.{layer}.self_attn.v_proj.weight",
    "blocks.{layer}.attention.w_out.weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blocks.{layer}.attention.q_norm.weight": "model.layers.{layer}.self_attn.q_norm.weight",
    "blocks.{layer}.attention.k_norm.weight": "model.layers.{layer}.self_attn.k_norm.weight",
    "blocks.{layer}.attention_norm.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blocks.{layer}.feed_forward_norm.weight": "model.layers.{layer}.post_feedforward_layernorm.weight",
    "blocks.{layer}.feed_forward.w1.weight": "model.layers.{layer}.mlp.gate_proj.weight",
    "blocks.{layer}.feed_forward.w2.weight": "model.layers.{layer}.mlp.down_proj.weight",
    "blocks.{layer}.feed_forward.w3.weight": "model.layers.{layer}.mlp.up_proj.weight",
    **{
        f"blocks.{{layer}}.attention.{name}.weight": f"model.layers.{{layer}}.self_attn.{name}.weight"
        for name in F_PHI_WEIGHTS
    },
}
"""OLMo-core name -> HF name in block {layer} (f_phi's weights only in RePo layers)."""


def _key_map(n_layers: int) -> dict[str, str]:
    keys = dict(MODEL_KEYS)
    for layer in range(n_layers):
        keys.update({c.format(layer=layer): h.format(layer=layer) for c, h in LAYER_KEYS.items()})
    return keys


def _rename(state: dict[str, Tensor], keys: dict[str, str], what: str) -> dict[str, Tensor]:
    if unknown := sorted(set(state) - set(keys)):
        raise ValueError(f"{what} has weights with no counterpart: {', '.join(unknown[:8])}")
    return {keys[name]: tensor for name, tensor in state.items()}


def hf_state_from_core(state: dict[str, Tensor], n_layers: int, tied: bool) -> dict[str, Tensor]:
    """An OLMo-core model state dict -> HF names (tensors as they are; a tied output layer is left out)."""
    if tied:
        state = {k: v for k, v in state.items() if k != "lm_head.w_out.weight"}
    return _rename(state, _key_map(n_layers), "the OLMo-core model")


def core_state_from_hf(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """An HF Olmo2 / RepoOlmo2 state dict -> OLMo-core names (tensors as they are)."""
    inverse = {h: c for c, h in _key_map(n_layers).items()}
    return _rename(state, inverse, "the Hugging Face model")


# --------------------------------------------------------------------------------------------- configs


def _rope_scaling(parameters: dict[str, Any]) -> Any:
    """HF `rope_parameters` -> OLMo-core's scaling config (None for default RoPE)."""
    kind = parameters.get("rope_type", "default")
    if kind == "default":
        return None
    if kind == "linear":
        return PIRoPEScalingConfig(factor=float(parameters["factor"]))
    if kind == "yarn":
        return YaRNRoPEScalingConfig(
            factor=float(parameters["factor"]),
            beta_fast=int(parameters.get("beta_fast", 32)),
            beta_slow=int(parameters.get("beta_slow", 1)),
            old_context_len=int(parameters["original_max_position_embeddings"]),
        )
    raise ValueError(
        f"rope_parameters.rope_type={kind!r} has no OLMo-core counterpart; allowed: default, linear, yarn"
    )


def _hf_rope_parameters(config: AttentionConfig) -> dict[str, Any]:
    rope = config.rope
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(rope.theta)}
    if isinstance(rope.scaling, PIRoPEScalingConfig):
        out.update(rope_type="linear", factor=rope.scaling.factor)
    elif isinstance(rope.scaling, YaRNRoPEScalingConfig):
        hf = rope.scaling.to_hf_config()
        out.update(
            {
                k: hf[k]
                for k in ("rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
            }
        )
    elif rope.scaling is not None:
        raise ValueError(
            f"model.block.sequence_mixer.rope.scaling: {type(rope.scaling).__name__} has no HF counterpart"
        )
    return out


def _hf_rope(hf: PreTrainedConfig) -> dict[str, Any]:
    """The one RoPE of an HF Olmo 2 / Olmo 3 config (OLMo-core's attention config has one for every layer)."""
    parameters = dict(hf.rope_parameters or {})
    if not isinstance(hf, Olmo3Config):
        return parameters
    if parameters.get("sliding_attention") != parameters.get("full_attention"):
        raise ValueError(
            "config.json: rope_parameters.sliding_attention and rope_parameters.full_attention differ; OLMo-core's "
            "attention config has one RoPE for every layer (give both the same parameters)"
        )
    return dict(parameters.get("full_attention") or {})


def _core_sliding_window(hf: PreTrainedConfig) -> SlidingWindowAttentionConfig | None:
    """HF `layer_types` and `sliding_window` -> OLMo-core's pattern, one entry per layer (None: no sliding)."""
    if not isinstance(hf, Olmo3Config) or "sliding_attention" not in hf.layer_types:
        return None
    if hf.sliding_window is None or hf.sliding_window < 1:
        raise ValueError(f"config.json: sliding_window={hf.sliding_window} must be a positive window size")
    pattern = [hf.sliding_window if kind == "sliding_attention" else -1 for kind in hf.layer_types]
    return SlidingWindowAttentionConfig(
        pattern=pattern, force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=False
    )


def core_config_from_hf(hf: PreTrainedConfig, dtype: DType = DType.float32) -> TransformerConfig:
    """The OLMo-core `TransformerConfig` of an HF Olmo2 / RepoOlmo2 / Olmo3 / RepoOlmo3 config (its position modes
    and sliding windows included)."""
    if hf.attention_bias:
        raise ValueError("config.json: attention_bias=true has no counterpart in the Olmo 2 and 3 shapes")
    parameters = _hf_rope(hf)
    theta = float(parameters.get("rope_theta", 10000.0))
    if not theta.is_integer():
        raise ValueError(f"config.json: rope_theta={theta} is not an integer, as OLMo-core's RoPE needs")
    kv = hf.num_key_value_heads
    config = TransformerConfig.llama_like(
        d_model=hf.hidden_size,
        vocab_size=hf.vocab_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        n_kv_heads=None if kv in (None, hf.num_attention_heads) else kv,
        block_name=TransformerBlockType.reordered_norm,
        qk_norm=True,
        rope_theta=int(theta),
        rope_scaling=_rope_scaling(parameters),
        layer_norm_eps=hf.rms_norm_eps,
        feed_forward=FeedForwardConfig(hidden_size=hf.intermediate_size, bias=False, dtype=dtype),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
        sliding_window=_core_sliding_window(hf),
        dtype=dtype,
    )
    if isinstance(hf, RepoOlmo2Config | RepoOlmo3Config):
        config = with_position_modes(config, hf.pe_mode, hf.pe_start_layer, hf.pe_layer_ids)
    return config


def _shape_error(key: str, value: Any, needs: str) -> ValueError:
    return ValueError(
        f"model.{key}={value}: not the Olmo 2 or Olmo 3 shape ({needs}); this converter writes olmo2, "
        "repo_olmo2, olmo3 and repo_olmo3"
    )


def _check_shape(config: TransformerConfig) -> AttentionConfig:
    """The block's attention config, after checking every key the Olmo 2 and 3 shapes fix (Olmo 3: sliding
    windows besides); ValueError naming it."""
    if isinstance(config.block, dict) or config.block_pattern or config.block_overrides:
        raise _shape_error("block_overrides", "set", "one block config for every layer")
    block, att = config.block, config.block.sequence_mixer
    if block.name != TransformerBlockType.reordered_norm:
        raise _shape_error("block.name", block.name, "reordered_norm")
    if not isinstance(att, AttentionConfig) or att.name != AttentionType.default:
        raise _shape_error("block.sequence_mixer.name", getattr(att, "name", att), "default attention")
    checks = {
        "block.layer_norm.name": (
            block.layer_norm.name,
            block.layer_norm.name in (LayerNormType.rms, LayerNormType.fused_rms),
        ),
        "block.sequence_mixer.bias": (att.bias, not att.bias),
        "block.sequence_mixer.qk_norm": (att.qk_norm, att.qk_norm is not None and not att.use_head_qk_norm),
        "block.sequence_mixer.gate": (att.gate, att.gate is None),
        "block.sequence_mixer.clip_qkv": (att.clip_qkv, att.clip_qkv is None),
        "block.sequence_mixer.rope": (
            att.rope,
            att.rope is not None
            and att.rope.name == RoPEType.default
            and not att.rope.no_global_rope
            and att.rope.partial_rotary_factor == 1.0,
        ),
        "block.feed_forward.bias": (block.feed_forward.bias, not block.feed_forward.bias),
        "embedding_norm": (config.embedding_norm, config.embedding_norm is None),
        "embed_scale": (config.embed_scale, config.embed_scale is None),
        "lm_head.bias": (config.lm_head.bias, not config.lm_head.bias),
    }
    for key, (value, ok) in checks.items():
        if not ok:
            raise _shape_error(key, value, "the value OLMo-core's olmo2 and olmo3 presets use")
    return att


def _hf_layer_types(config: TransformerConfig, att: AttentionConfig) -> dict[str, Any]:
    """OLMo-core's sliding-window pattern -> HF `layer_types` and `sliding_window` ({} if no layer slides)."""
    window, n = att.sliding_window, config.n_layers
    if window is None or not any(window.should_use_swa(i, n) for i in range(n)):
        return {}
    sizes = {window.get_window_size(i, n) for i in range(n) if window.should_use_swa(i, n)}
    if len(sizes) != 1:
        raise _shape_error("block.sequence_mixer.sliding_window.pattern", window.pattern, "one window size")
    kinds = ["sliding_attention" if window.should_use_swa(i, n) else "full_attention" for i in range(n)]
    return {"layer_types": kinds, "sliding_window": sizes.pop()}


def hf_config_from_core(
    config: TransformerConfig,
    *,
    eos_token_id: int | None,
    pad_token_id: int | None,
    bos_token_id: int | None = None,
    max_position_embeddings: int = 4096,
) -> PreTrainedConfig:
    """The HF config of an Olmo-2- or Olmo-3-shaped OLMo-core model: `olmo2` / `olmo3` (sliding windows) if every
    layer is RoPE, else `repo_olmo2` / `repo_olmo3`. Raises ValueError naming the first key that is neither
    shape."""
    att = _check_shape(config)
    rope = _hf_rope_parameters(att)
    kwargs: dict[str, Any] = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.block.feed_forward.hidden_size,
        num_hidden_layers=config.n_layers,
        num_attention_heads=att.n_heads,
        num_key_value_heads=att.n_kv_heads or att.n_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=config.block.layer_norm.eps,
        rope_parameters=rope,
        attention_bias=False,
        tie_word_embeddings=config.tie_word_embeddings,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
    )
    stock, repo = Olmo2Config, RepoOlmo2Config
    if sliding := _hf_layer_types(config, att):
        # OLMo-core rotates every layer with the one RoPE of its attention config
        kwargs.update(sliding, rope_parameters={"sliding_attention": rope, "full_attention": dict(rope)})
        stock, repo = Olmo3Config, RepoOlmo3Config
    if not any(mode != PositionMode.rope for mode in layer_modes(att, n_layers=config.n_layers)):
        return stock(**kwargs)
    assert isinstance(att, RepoAttentionConfig)
    return repo(
        **kwargs, pe_mode=str(att.pe_mode), pe_start_layer=att.pe_start_layer, pe_layer_ids=att.pe_layer_ids
    )
