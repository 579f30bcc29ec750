"""OLMo-core <-> Hugging Face for the Olmo 2 and Olmo 3 shapes and the Llama and Qwen 3 families: configs and
weight names, nothing dropped or guessed.

The Olmo 2 shape (OLMo-core's `olmo2_*` presets; the OLMo 2 checkpoints) is a `reordered_norm` block with RMS
norms, full-width q/k norms, SwiGLU and no biases. In Hugging Face it is `olmo2` (every layer RoPE) or this
project's `repo_olmo2` (`olmo_repo.hf`: a position mode per layer, RePo weights under the same names). The
Olmo 3 shape (`olmo3_*` presets) is the same block with sliding-window attention in some layers (OLMo-core's
`sliding_window` pattern); in Hugging Face `olmo3` or `repo_olmo3`, whose `layer_types` list each layer's
attention and whose `sliding_window` is OLMo-core's window size (both count the token itself: OLMo-core hands
flash attention `window_size - 1`). Weight names are the same in both. The maps below are one-to-one, with `{layer}`
placeholders as OLMo-core's own key maps have; every key of the input must map and every key of the target
must be filled, else one error names the keys.

Llama (`llama`, this project's `repo_llama`) and Qwen 3 (`qwen3`, `repo_qwen3`) are OLMo-core's pre-norm block
(`TransformerBlockType.default`, as its `llama3_*` and `qwen3_*` presets build them; Qwen 3 with RMS q/k norms
over each head). Their weights go through OLMo-core's own state converters (`olmo_core.nn.hf.convert`, model
types `llama` and `qwen3`); the weights those do not map (f_phi's, the attention biases: `SIDE_KEYS`) are taken
out before and put back renamed. OLMo-core 3.0.0 converts no config of these families, so each has one table
here (`LLAMA`, `QWEN3`: a `Row` per HF key, read by both directions) and the HF values OLMo-core cannot express
are refused in one line naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from olmo_core.config import DType
from olmo_core.nn.attention import AttentionConfig, AttentionType, SlidingWindowAttentionConfig
from olmo_core.nn.feed_forward import ActivationFunction, FeedForwardConfig, FeedForwardType
from olmo_core.nn.hf.convert import convert_state_from_hf, convert_state_to_hf
from olmo_core.nn.layer_norm import LayerNormType
from olmo_core.nn.rope import (
    PIRoPEScalingConfig,
    RoPEType,
    StepwiseRoPEScalingConfig,
    YaRNRoPEScalingConfig,
)
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from torch import Tensor
from transformers import LlamaConfig, Olmo2Config, Olmo3Config, PreTrainedConfig, Qwen3Config

from ..hf import RepoLlamaConfig, RepoOlmo2Config, RepoOlmo3Config, RepoQwen3Config
from ..modes import F_PHI_WEIGHTS, PE_KEYS, PositionMode, layer_modes
from .attention import RepoAttentionConfig, with_position_modes

__all__ = [
    "FAMILIES",
    "LAYER_KEYS",
    "LLAMA",
    "MODEL_KEYS",
    "QWEN3",
    "SIDE_KEYS",
    "Family",
    "Row",
    "core_config_from_hf",
    "core_state_from_hf",
    "family_of",
    "hf_config_from_core",
    "hf_state_from_core",
    "state_from_hf",
    "state_to_hf",
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
    and sliding windows included), or of a Llama / Qwen 3 one (stock or RePo: its family's table)."""
    if (family := family_of(hf)) is not None:
        return family_config_from_hf(family, hf, dtype)
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
        config = with_position_modes(config, **_core_position_keys(hf))
    return config


def _core_position_keys(hf: PreTrainedConfig) -> dict[str, Any]:
    """The position keys of an HF RePo config that OLMo-core's attention config takes (`modes.PE_KEYS`: the
    layers' modes and the index blend's schedule, which a new run starts again at step 0)."""
    return {key: getattr(hf, key) for key in PE_KEYS}


def _hf_position_keys(att: RepoAttentionConfig, pe_blend: float) -> dict[str, Any]:
    """The HF config's position keys of an OLMo-core RePo attention config: `modes.PE_KEYS` as recorded, and
    `pe_blend`, the p the model scores with (the schedule's at the checkpoint's step)."""
    return {**{key: getattr(att, key) for key in PE_KEYS}, "pe_mode": str(att.pe_mode), "pe_blend": pe_blend}


def _shape_error(key: str, value: Any, needs: str) -> ValueError:
    return ValueError(
        f"model.{key}={value}: not the Olmo 2 or Olmo 3 shape ({needs}); this converter writes olmo2, "
        "repo_olmo2, olmo3 and repo_olmo3 (and llama, qwen3 from a default block without q/k norms or with "
        "per-head ones)"
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
    pe_blend: float = 0.0,
) -> PreTrainedConfig:
    """The HF config of an Olmo-2- or Olmo-3-shaped OLMo-core model: `olmo2` / `olmo3` (sliding windows) if every
    layer is RoPE, else `repo_olmo2` / `repo_olmo3`; a default (pre-norm) block as `llama` / `qwen3` (per-head
    q/k norms) or `repo_llama` / `repo_qwen3`. `pe_blend`: the index blend's p the RePo layers score with (the
    schedule's at the checkpoint's step). Raises ValueError naming the first key that is no shape."""
    if (family := _family_of_core(config)) is not None:
        return _family_hf_config(
            family,
            config,
            pe_blend,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            max_position_embeddings=max_position_embeddings,
        )
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
    return repo(**kwargs, **_hf_position_keys(att, pe_blend))


# ------------------------------------------------------------------------------------ Llama and Qwen 3


@dataclass(frozen=True)
class Row:
    """One row of a family table: the HF config keys it covers, their OLMo-core values (`to_core`: llama_like
    arguments by name, or dotted paths set on the built config, e.g. `block.sequence_mixer.bias`) and the way
    back (`to_hf`: read from an OLMo-core config, the same HF keys). Both directions read the same row, so a
    key cannot be mapped one way and forgotten the other."""

    hf: tuple[str, ...]
    to_core: Callable[[PreTrainedConfig], dict[str, Any]]
    to_hf: Callable[[TransformerConfig], dict[str, Any]]


@dataclass(frozen=True)
class Family:
    """A Hugging Face family that OLMo-core builds with its pre-norm block (`TransformerBlockType.default`, as in
    its `llama3_*` and `qwen3_*` presets): its configs, the model type OLMo-core's state converters know it by,
    its table of keys and the HF keys that take one value only. What every family shares (block type, norms,
    RoPE precision) is fixed in `family_config_from_hf`."""

    stock: type[PreTrainedConfig]
    repo: type[PreTrainedConfig]
    core_model_type: str
    """`model_type` of `olmo_core.nn.hf.convert`, which names the norms by it (a repo_* config is asked as it)."""
    head_qk_norm: bool
    """RMS norms on q and k over each head (Qwen 3), or none (Llama)."""
    rows: tuple[Row, ...]
    hf_fixed: dict[str, Any]
    """HF key -> the one value OLMo-core can express (anything else refused naming the key)."""
    hf_free: dict[str, str]
    """HF keys that no row maps, with the reason (the tokenizer's ids and the length live elsewhere in the
    checkpoint; transformers' runtime switches): `tests/core/test_convert_families.py` checks that rows,
    `hf_fixed` and these cover every key of the HF config class."""


def _same(hf: str, kwarg: str, path: str) -> Row:
    """A row for a key that is one value on both sides (`kwarg` of llama_like, read back at `path`)."""
    return Row((hf,), lambda c: {kwarg: getattr(c, hf)}, lambda c: {hf: _get(c, path)})


def _get(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


def _set(config: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    setattr(_get(config, ".".join(parents)) if parents else config, last, value)


def _family_error(key: str, value: Any, needs: str) -> ValueError:
    return ValueError(
        f"model.{key}={value}: not the Llama or Qwen 3 shape ({needs}); this converter writes llama, repo_llama, "
        "qwen3 and repo_qwen3 from a default (pre-norm) block"
    )


def _kv_heads(hf: PreTrainedConfig) -> dict[str, Any]:
    kv = hf.num_key_value_heads
    return {"n_kv_heads": None if kv in (None, hf.num_attention_heads) else kv}


def _head_dim(hf: PreTrainedConfig) -> dict[str, Any]:
    """Llama and Qwen 3 state head_dim; OLMo-core's None means d_model // n_heads (kept None where it is)."""
    head_dim = getattr(hf, "head_dim", None)
    return {"head_dim": None if head_dim in (None, hf.hidden_size // hf.num_attention_heads) else head_dim}


def _eps(config: TransformerConfig) -> dict[str, Any]:
    """HF has one rms_norm_eps for every norm (q/k norms too): OLMo-core's must agree."""
    att = config.block.sequence_mixer
    eps = config.block.layer_norm.eps
    others = {"lm_head.layer_norm.eps": config.lm_head.layer_norm.eps}
    if att.qk_norm is not None:
        others["block.sequence_mixer.qk_norm.eps"] = att.qk_norm.eps
    for path, value in others.items():
        if value != eps:
            raise _family_error(path, value, f"block.layer_norm.eps={eps}: HF has one rms_norm_eps")
    return {"rms_norm_eps": eps}


_ROPE_KEYS = {
    "default": {"rope_type", "rope_theta"},
    "linear": {"rope_type", "rope_theta", "factor"},
    "llama3": {
        "rope_type",
        "rope_theta",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    },
    "yarn": {
        "rope_type",
        "rope_theta",
        "factor",
        "beta_fast",
        "beta_slow",
        "original_max_position_embeddings",
    },
}
"""The `rope_parameters` keys OLMo-core's RoPE configs express, by rope_type (others refused, naming them)."""


def _family_rope(hf: PreTrainedConfig) -> dict[str, Any]:
    """HF `rope_parameters` -> llama_like's rope_theta and rope_scaling; Llama 3's `llama3` is OLMo-core's
    `StepwiseRoPEScalingConfig` (low_freq_factor = 1 / (1 - low_freq_proportion), high_freq_factor = 1 /
    high_freq_proportion), accepted only where those proportions give the factors back exactly."""
    parameters = dict(hf.rope_parameters or {})
    kind = parameters.get("rope_type", "default")
    if kind not in _ROPE_KEYS:
        raise ValueError(
            f"config.json: rope_parameters.rope_type={kind!r} has no OLMo-core counterpart; allowed: "
            f"{', '.join(_ROPE_KEYS)}"
        )
    if extra := sorted(set(parameters) - _ROPE_KEYS[kind]):
        raise ValueError(
            f"config.json: rope_parameters.{extra[0]} has no counterpart in OLMo-core's {kind} RoPE; allowed: "
            f"{', '.join(sorted(_ROPE_KEYS[kind]))}"
        )
    theta = float(parameters.get("rope_theta", 10000.0))
    if not theta.is_integer():
        raise ValueError(f"config.json: rope_theta={theta} is not an integer, as OLMo-core's RoPE needs")
    if kind != "llama3":
        return {"rope_theta": int(theta), "rope_scaling": _rope_scaling(parameters)}
    low, high = float(parameters["low_freq_factor"]), float(parameters["high_freq_factor"])
    scaling = StepwiseRoPEScalingConfig(
        factor=float(parameters["factor"]),
        low_freq_proportion=1.0 - 1.0 / low,
        high_freq_proportion=1.0 / high,
        old_context_len=int(parameters["original_max_position_embeddings"]),
    )
    back = scaling.to_hf_config()
    for key in ("low_freq_factor", "high_freq_factor"):
        if back[key] != parameters[key]:
            raise ValueError(
                f"config.json: rope_parameters.{key}={parameters[key]} is not stated exactly by OLMo-core's "
                f"Llama 3 scaling (it would read {back[key]})"
            )
    return {"rope_theta": int(theta), "rope_scaling": scaling}


def _family_rope_parameters(config: TransformerConfig) -> dict[str, Any]:
    rope = config.block.sequence_mixer.rope
    if (
        rope is None
        or rope.name != RoPEType.default
        or rope.no_global_rope
        or rope.partial_rotary_factor != 1.0
    ):
        raise _family_error("block.sequence_mixer.rope", rope, "default RoPE over whole heads in every layer")
    if isinstance(rope.scaling, StepwiseRoPEScalingConfig):
        if rope.scaling.attention_rescale_factor != 1.0:
            raise _family_error(
                "block.sequence_mixer.rope.scaling.attention_rescale_factor",
                rope.scaling.attention_rescale_factor,
                "1.0, as Llama 3's",
            )
        return {"rope_parameters": {"rope_theta": float(rope.theta), **rope.scaling.to_hf_config()}}
    return {"rope_parameters": _hf_rope_parameters(config.block.sequence_mixer)}


def _feed_forward(hf: PreTrainedConfig) -> dict[str, Any]:
    return {"feed_forward": FeedForwardConfig(hidden_size=hf.intermediate_size, bias=False)}


def _bias(value: bool | None) -> bool:
    """OLMo-core's bias flags: None means biases (for every module type but `normalized`, refused here)."""
    return value is None or bool(value)


def _attention_bias(hf: PreTrainedConfig) -> dict[str, Any]:
    """Biases on q, k, v and o, as OLMo-core's attention has them all with `bias` (dotted: set after build)."""
    return {"block.sequence_mixer.bias": bool(hf.attention_bias)}


def _qwen3_windows(hf: PreTrainedConfig) -> dict[str, Any]:
    """Qwen 3's `layer_types` (what its layers do: transformers derives it from use_sliding_window and
    max_window_layers where it is unset) and `sliding_window` -> OLMo-core's pattern, one entry per layer."""
    kinds = list(hf.layer_types or [])
    if "sliding_attention" not in kinds:
        return {}
    if not hf.sliding_window or hf.sliding_window < 1:
        raise ValueError(
            f"config.json: sliding_window={hf.sliding_window} (use_sliding_window={hf.use_sliding_window}) must "
            "be a positive window size where layer_types has sliding_attention"
        )
    pattern = [hf.sliding_window if kind == "sliding_attention" else -1 for kind in kinds]
    window = SlidingWindowAttentionConfig(
        pattern=pattern, force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=False
    )
    return {"sliding_window": window}


def _qwen3_layer_types(config: TransformerConfig) -> dict[str, Any]:
    """OLMo-core's windows -> Qwen 3's keys; max_window_layers (read by transformers only where layer_types is
    unset) is the first sliding layer, or num_hidden_layers where none slides (as every Qwen 3 release states)."""
    window, n = config.block.sequence_mixer.sliding_window, config.n_layers
    sliding = [i for i in range(n) if window is not None and window.should_use_swa(i, n)]
    kinds = ["sliding_attention" if i in sliding else "full_attention" for i in range(n)]
    if not sliding:
        return dict(use_sliding_window=False, sliding_window=None, max_window_layers=n, layer_types=kinds)
    sizes = {window.get_window_size(i, n) for i in sliding}
    if len(sizes) != 1:
        raise _family_error("block.sequence_mixer.sliding_window.pattern", window.pattern, "one window size")
    return dict(
        use_sliding_window=True, sliding_window=sizes.pop(), max_window_layers=sliding[0], layer_types=kinds
    )


def _no_windows(config: TransformerConfig) -> dict[str, Any]:
    window, n = config.block.sequence_mixer.sliding_window, config.n_layers
    if window is not None and any(window.should_use_swa(i, n) for i in range(n)):
        raise _family_error("block.sequence_mixer.sliding_window", window, "no sliding window in Llama")
    return {}


_COMMON_ROWS = (
    _same("vocab_size", "vocab_size", "vocab_size"),
    _same("hidden_size", "d_model", "d_model"),
    _same("num_hidden_layers", "n_layers", "n_layers"),
    _same("num_attention_heads", "n_heads", "block.sequence_mixer.n_heads"),
    Row(
        ("num_key_value_heads",),
        _kv_heads,
        lambda c: {
            "num_key_value_heads": c.block.sequence_mixer.n_kv_heads or c.block.sequence_mixer.n_heads
        },
    ),
    Row(
        ("head_dim",),
        _head_dim,
        lambda c: {
            "head_dim": c.block.sequence_mixer.head_dim or c.d_model // c.block.sequence_mixer.n_heads
        },
    ),
    Row(
        ("intermediate_size",),
        _feed_forward,
        lambda c: {"intermediate_size": c.block.feed_forward.hidden_size},
    ),
    Row(("rms_norm_eps",), lambda c: {"layer_norm_eps": c.rms_norm_eps}, _eps),
    Row(("rope_parameters",), _family_rope, _family_rope_parameters),
    Row(
        ("attention_bias",), _attention_bias, lambda c: {"attention_bias": _bias(c.block.sequence_mixer.bias)}
    ),
    _same("tie_word_embeddings", "tie_word_embeddings", "tie_word_embeddings"),
    _same("initializer_range", "init_std", "init_std"),
)

_HF_FREE = {
    "max_position_embeddings": "the training length: train_module.max_sequence_length of the checkpoint",
    "bos_token_id": "dataset.tokenizer of the checkpoint",
    "eos_token_id": "dataset.tokenizer of the checkpoint",
    "pad_token_id": "dataset.tokenizer of the checkpoint",
    "use_cache": "transformers' generation switch, no part of the model",
}

LLAMA = Family(
    stock=LlamaConfig,
    repo=RepoLlamaConfig,
    core_model_type="llama",
    head_qk_norm=False,
    rows=(*_COMMON_ROWS, Row((), lambda c: {}, _no_windows)),
    hf_fixed={"hidden_act": "silu", "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1},
    hf_free=_HF_FREE,
)
"""HF `llama` / `repo_llama` <-> OLMo-core (its `llama3_*` presets: no q/k norm)."""

QWEN3 = Family(
    stock=Qwen3Config,
    repo=RepoQwen3Config,
    core_model_type="qwen3",
    head_qk_norm=True,
    rows=(
        *_COMMON_ROWS,
        Row(
            ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers"),
            _qwen3_windows,
            _qwen3_layer_types,
        ),
    ),
    hf_fixed={"hidden_act": "silu", "attention_dropout": 0.0},
    hf_free=_HF_FREE,
)
"""HF `qwen3` / `repo_qwen3` <-> OLMo-core (its `qwen3_*` presets: RMS q/k norms over each head's head_dim)."""

FAMILIES = (LLAMA, QWEN3)


def family_of(hf: PreTrainedConfig) -> Family | None:
    """The family of an HF config (None: the Olmo 2 / Olmo 3 shapes, which the maps above convert)."""
    return next((f for f in FAMILIES if isinstance(hf, f.stock)), None)


def family_config_from_hf(
    family: Family, hf: PreTrainedConfig, dtype: DType = DType.float32
) -> TransformerConfig:
    """OLMo-core's config of an HF Llama / Qwen 3 config: OLMo-core's `llama_like` with a pre-norm block, RMS
    norms in HF's rounding order (`qwen_rms`: normalised in fp32, cast back, then scaled, as LlamaRMSNorm and
    Qwen3RMSNorm do) and RoPE applied in the activations' dtype (`full_precision=False`, as HF's), every other
    value from the family's table; position modes for repo_llama / repo_qwen3."""
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
        block_name=TransformerBlockType.default,
        layer_norm_name=LayerNormType.qwen_rms,
        rope_full_precision=False,
        qk_norm=family.head_qk_norm,
        use_head_qk_norm=family.head_qk_norm,
        dtype=dtype,
    )
    for path, value in paths.items():
        _set(config, path, value)
    if isinstance(hf, family.repo):
        config = with_position_modes(config, **_core_position_keys(hf))
    return config


def _family_of_core(config: TransformerConfig) -> Family | None:
    """Llama for a default block without q/k norm, Qwen 3 with per-head q/k norms; None otherwise."""
    if isinstance(config.block, dict) or config.block.name != TransformerBlockType.default:
        return None
    att = config.block.sequence_mixer
    if not isinstance(att, AttentionConfig):
        return None
    if att.qk_norm is None:
        return LLAMA
    return QWEN3 if att.use_head_qk_norm and not att.qk_norm_per_head_gains else None


def _check_family_shape(config: TransformerConfig) -> AttentionConfig:
    """Every key the Llama and Qwen 3 shapes fix, checked; ValueError naming the first that differs."""
    if config.block_pattern or config.block_overrides:
        raise _family_error("block_overrides", "set", "one block config for every layer")
    block, att = config.block, config.block.sequence_mixer
    for key, value in (
        ("block.feed_forward", block.feed_forward),
        ("lm_head.layer_norm", config.lm_head.layer_norm),
    ):
        if value is None:
            raise _family_error(key, value, "set: a SwiGLU feed-forward and a final RMS norm")
    norms = (LayerNormType.rms, LayerNormType.fused_rms, LayerNormType.qwen_rms)
    checks = {
        "block.sequence_mixer.name": (att.name, att.name == AttentionType.default),
        "block.layer_norm.name": (block.layer_norm.name, block.layer_norm.name in norms),
        "block.layer_norm.bias": (block.layer_norm.bias, not _bias(block.layer_norm.bias)),
        "lm_head.layer_norm.bias": (
            config.lm_head.layer_norm.bias,
            not _bias(config.lm_head.layer_norm.bias),
        ),
        "lm_head.layer_norm.name": (config.lm_head.layer_norm.name, config.lm_head.layer_norm.name in norms),
        "block.sequence_mixer.qk_norm.name": (
            att.qk_norm and att.qk_norm.name,
            att.qk_norm is None or (att.qk_norm.name in norms and not _bias(att.qk_norm.bias)),
        ),
        "block.sequence_mixer.gate": (att.gate, att.gate is None),
        "block.sequence_mixer.clip_qkv": (att.clip_qkv, att.clip_qkv is None),
        "block.sequence_mixer.dropout": (att.dropout, not att.dropout),
        "block.sequence_mixer.scalable_softmax": (att.scalable_softmax, not att.scalable_softmax),
        "block.sequence_mixer.attention_sinks": (att.attention_sinks, not att.attention_sinks),
        "block.feed_forward_moe": (block.feed_forward_moe, block.feed_forward_moe is None),
        "block.feed_forward.name": (
            block.feed_forward.name,
            block.feed_forward.name == FeedForwardType.default,
        ),
        "block.feed_forward.bias": (block.feed_forward.bias, not _bias(block.feed_forward.bias)),
        "block.feed_forward.activation": (
            block.feed_forward.activation,
            block.feed_forward.activation == ActivationFunction.silu,
        ),
        "block.dropout": (block.dropout, not block.dropout),
        "embedding_norm": (config.embedding_norm, config.embedding_norm is None),
        "embed_scale": (config.embed_scale, config.embed_scale is None),
        "lm_head.bias": (config.lm_head.bias, not _bias(config.lm_head.bias)),
    }
    for key, (value, ok) in checks.items():
        if not ok:
            raise _family_error(key, value, "the value of the HF model")
    return att


def _family_hf_config(
    family: Family, config: TransformerConfig, pe_blend: float, **given: Any
) -> PreTrainedConfig:
    """The HF config of a Llama- or Qwen-3-shaped OLMo-core config, from the family's table; `given`: the
    tokenizer's ids and the length, which the checkpoint records beside its model config; `pe_blend`: the p its
    RePo layers score with."""
    att = _check_family_shape(config)
    values: dict[str, Any] = dict(family.hf_fixed)
    for row in family.rows:
        values.update(row.to_hf(config))
    values.update(given)
    if not any(mode != PositionMode.rope for mode in layer_modes(att, n_layers=config.n_layers)):
        return family.stock(**values)
    assert isinstance(att, RepoAttentionConfig)
    return family.repo(**values, **_hf_position_keys(att, pe_blend))


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
"""OLMo-core name -> HF name of the Llama / Qwen 3 weights OLMo-core's state converters (3.0.0) leave out: the
attention biases (attention_bias) and f_phi's (RePo layers)."""


def _side_keys(n_layers: int) -> dict[str, str]:
    return {c.format(layer=i): h.format(layer=i) for i in range(n_layers) for c, h in SIDE_KEYS.items()}


def _unconverted(error: RuntimeError, what: str) -> ValueError:
    """OLMo-core's converter says "Some state keys were not converted: [...]": one line naming them."""
    return ValueError(f"{what} has weights with no counterpart ({error})")


def state_from_hf(hf: PreTrainedConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An HF state dict -> OLMo-core names, tensors as they are: Olmo 2 / 3 by the maps above, Llama and Qwen 3
    by OLMo-core's `convert_state_from_hf` with `SIDE_KEYS` beside it (a tied output layer under both names)."""
    if (family := family_of(hf)) is None:
        return core_state_from_hf(state, hf.num_hidden_layers)
    side = {h: c for c, h in _side_keys(hf.num_hidden_layers).items()}
    try:
        out = convert_state_from_hf(
            hf, {k: v for k, v in state.items() if k not in side}, model_type=family.core_model_type
        )
    except RuntimeError as e:
        raise _unconverted(e, "the Hugging Face model") from None
    return {**out, **{side[k]: v for k, v in state.items() if k in side}}


def state_to_hf(hf: PreTrainedConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An OLMo-core state dict -> the HF names of `hf` (the converted config), tensors as they are; a tied output
    layer is left out."""
    if hf.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.w_out.weight"}
    if (family := family_of(hf)) is None:
        return hf_state_from_core(state, hf.num_hidden_layers, tied=False)
    side = _side_keys(hf.num_hidden_layers)
    # OLMo-core picks its norm names by model_type; a repo_llama / repo_qwen3 config is asked as its family
    target = SimpleNamespace(model_type=family.core_model_type, num_hidden_layers=hf.num_hidden_layers)
    try:
        out = convert_state_to_hf(target, {k: v for k, v in state.items() if k not in side})  # type: ignore[arg-type]
    except RuntimeError as e:
        raise _unconverted(e, "the OLMo-core model") from None
    return {**out, **{side[k]: v for k, v in state.items() if k in side}}
