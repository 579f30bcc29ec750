"""The Hugging Face families OLMo-core models convert to and from: a `Family` each, its block as OLMo-core builds
it and its table of `Row`s, one per HF config key and read by both directions (`olmo_repo.olmocore.convert` is the
mechanism that reads them). OLMo-core 3.0.0 reads no HF config into a `TransformerConfig`, hence the tables.

- Olmo 2 (`olmo2`, this project's `repo_olmo2`; OLMo-core's `olmo2_*` presets): a `reordered_norm` block with RMS
  norms, q/k norms over the whole width, SwiGLU and no biases.
- Olmo 3 (`olmo3`, `repo_olmo3`; `olmo3_*`): the same block with sliding-window attention in some layers, HF's
  `layer_types` listing each layer's; HF's `sliding_window` is OLMo-core's window size (both count the token
  itself: OLMo-core hands flash attention `window_size - 1`).
- Llama (`llama`, `repo_llama`) and Qwen 3 (`qwen3`, `repo_qwen3`): OLMo-core's pre-norm block (`default`, as its
  `llama3_*` and `qwen3_*` presets build it), Qwen 3 with RMS q/k norms over each head.

HF values OLMo-core cannot express are refused in one line naming the key, and so are OLMo-core values the HF
config cannot state (`ShapeError`, worded by the family's `refusal`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

from olmo_core.nn.attention import SlidingWindowAttentionConfig
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.layer_norm import LayerNormType
from olmo_core.nn.rope import (
    PIRoPEScalingConfig,
    RoPEScalingConfig,
    RoPEType,
    StepwiseRoPEScalingConfig,
    YaRNRoPEScalingConfig,
)
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from transformers import LlamaConfig, Olmo2Config, Olmo3Config, PreTrainedConfig, Qwen3Config

from ..hf import RepoLlamaConfig, RepoOlmo2Config, RepoOlmo3Config, RepoQwen3Config

__all__ = [
    "FAMILIES",
    "LLAMA",
    "OLMO2",
    "OLMO3",
    "QWEN3",
    "Family",
    "Row",
    "ShapeError",
    "has_bias",
    "sliding_layers",
]


class ShapeError(ValueError):
    """An OLMo-core config value its family's HF config cannot state: `key` (dotted, under `model`), the value and
    what the family needs there (`Family.refusal` words it for the family)."""

    def __init__(self, key: str, value: Any, needs: str) -> None:
        super().__init__(key, value, needs)
        self.key, self.value, self.needs = key, value, needs


@dataclass(frozen=True)
class Row:
    """One row of a family table: the HF config keys it covers, their OLMo-core values (`to_core`: llama_like
    arguments by name, or dotted paths set on the built config, e.g. `block.sequence_mixer.bias`) and the way
    back (`to_hf`: read from an OLMo-core config, the same HF keys). Both directions read the same row, so a
    key cannot be mapped one way and forgotten the other."""

    hf: tuple[str, ...]
    to_core: Callable[[PreTrainedConfig], dict[str, Any]]
    to_hf: Callable[[TransformerConfig], dict[str, Any]]


def has_bias(value: bool | None) -> bool:
    """OLMo-core's bias flags: None means biases (for every module type but `normalized`, refused here)."""
    return value is None or bool(value)


@dataclass(frozen=True)
class Family:
    """A Hugging Face family: its configs, the model type OLMo-core's state converters know it by, the block
    OLMo-core builds for it (`TransformerConfig.llama_like` with these values), its table of keys and the HF keys
    that take one value only."""

    stock: type[PreTrainedConfig]
    repo: type[PreTrainedConfig]
    core_model_type: str
    """`model_type` of `olmo_core.nn.hf.convert`, which names the norms by it (a repo_* config is asked as it)."""
    block: TransformerBlockType
    qk_norm: bool
    head_qk_norm: bool
    """With `qk_norm`: RMS norms on q and k over each head (Qwen 3), not over the whole width (Olmo 2 and 3)."""
    layer_norm: LayerNormType
    """The RMS norm in HF's rounding order: `rms` scales the fp32 normalised state, then casts (Olmo2RMSNorm);
    `qwen_rms` casts, then scales (LlamaRMSNorm, Qwen3RMSNorm)."""
    rope_full_precision: bool
    """RoPE in fp32 (HF's Olmo 2 and 3 keep cos and sin fp32) or in the activations' dtype (Llama, Qwen 3)."""
    rows: tuple[Row, ...]
    hf_fixed: dict[str, Any]
    """HF key -> the one value OLMo-core can express (anything else refused naming the key)."""
    hf_free: dict[str, str]
    """HF keys that no row maps, with the reason (the tokenizer's ids and the length live elsewhere in the
    checkpoint; transformers' runtime switches): `tests/core/test_convert_families.py` checks that rows,
    `hf_fixed` and these cover every key of the HF config class."""
    refusal: str
    """What a `ShapeError` of the family says after the key: the shape it is not (`{needs}`: what that needs)
    and what this converter writes."""


# ------------------------------------------------------------------------------------------------ rows


def _same(hf: str, kwarg: str, path: str) -> Row:
    """A row for a key that is one value on both sides (`kwarg` of llama_like, read back at `path`)."""
    return Row((hf,), lambda c: {kwarg: getattr(c, hf)}, lambda c: {hf: reduce(getattr, path.split("."), c)})


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
            raise ShapeError(path, value, f"block.layer_norm.eps={eps}: HF has one rms_norm_eps")
    return {"rms_norm_eps": eps}


def _no_attention_bias(hf: PreTrainedConfig) -> dict[str, Any]:
    """Olmo 2 and 3 have no attention biases (OLMo-core's `olmo2_*` and `olmo3_*` presets)."""
    if hf.attention_bias:
        raise ValueError("config.json: attention_bias=true has no counterpart in the Olmo 2 and 3 shapes")
    return {}


def _no_attention_bias_to_hf(config: TransformerConfig) -> dict[str, Any]:
    if has_bias(bias := config.block.sequence_mixer.bias):
        raise ShapeError("block.sequence_mixer.bias", bias, "no attention biases in Olmo 2 and 3")
    return {"attention_bias": False}


_ROPE_KEYS = {
    kind: {"rope_type", "rope_theta", *scaling}
    for kind, scaling in {
        "default": (),
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        "yarn": ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings"),
    }.items()
}
"""The `rope_parameters` keys OLMo-core's RoPE configs express, by rope_type (others refused, naming them)."""


def _rope(parameters: dict[str, Any]) -> dict[str, Any]:
    """HF `rope_parameters` -> llama_like's rope_theta and rope_scaling; Llama 3's `llama3` is OLMo-core's
    `StepwiseRoPEScalingConfig` (low_freq_factor = 1 / (1 - low_freq_proportion), high_freq_factor = 1 /
    high_freq_proportion), accepted only where those proportions give the factors back exactly."""
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
    scaling: RoPEScalingConfig | None = None
    if kind == "linear":
        scaling = PIRoPEScalingConfig(factor=float(parameters["factor"]))
    elif kind == "yarn":
        scaling = YaRNRoPEScalingConfig(
            factor=float(parameters["factor"]),
            beta_fast=int(parameters.get("beta_fast", 32)),
            beta_slow=int(parameters.get("beta_slow", 1)),
            old_context_len=int(parameters["original_max_position_embeddings"]),
        )
    elif kind == "llama3":
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


def _rope_parameters(config: TransformerConfig) -> dict[str, Any]:
    """OLMo-core's RoPE -> HF `rope_parameters` (the same keys `_rope` reads)."""
    rope = config.block.sequence_mixer.rope
    if (
        rope is None
        or rope.name != RoPEType.default
        or rope.no_global_rope
        or rope.partial_rotary_factor != 1.0
    ):
        raise ShapeError("block.sequence_mixer.rope", rope, "default RoPE over whole heads in every layer")
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(rope.theta)}
    scaling = rope.scaling
    if scaling is None:
        return out
    if isinstance(scaling, PIRoPEScalingConfig):
        return {**out, "rope_type": "linear", "factor": scaling.factor}
    if isinstance(scaling, YaRNRoPEScalingConfig):
        hf = scaling.to_hf_config()
        return {**out, **{k: hf[k] for k in sorted(_ROPE_KEYS["yarn"] - {"rope_theta"})}}
    if isinstance(scaling, StepwiseRoPEScalingConfig):
        if scaling.attention_rescale_factor != 1.0:
            raise ShapeError(
                "block.sequence_mixer.rope.scaling.attention_rescale_factor",
                scaling.attention_rescale_factor,
                "1.0, as Llama 3's",
            )
        return {**out, **scaling.to_hf_config()}
    raise ValueError(
        f"model.block.sequence_mixer.rope.scaling: {type(scaling).__name__} has no HF counterpart"
    )


def _one_rope(hf: PreTrainedConfig) -> dict[str, Any]:
    """The RoPE of an HF Olmo 3 config, which has one per layer type (OLMo-core's attention config one for all)."""
    parameters = dict(hf.rope_parameters or {})
    if parameters.get("sliding_attention") != parameters.get("full_attention"):
        raise ValueError(
            "config.json: rope_parameters.sliding_attention and rope_parameters.full_attention differ; OLMo-core's "
            "attention config has one RoPE for every layer (give both the same parameters)"
        )
    return _rope(dict(parameters.get("full_attention") or {}))


def _rope_per_layer_type(config: TransformerConfig) -> dict[str, Any]:
    rope = _rope_parameters(config)  # OLMo-core rotates every layer with the one RoPE of its attention config
    return {"rope_parameters": {"sliding_attention": rope, "full_attention": dict(rope)}}


def sliding_layers(config: TransformerConfig) -> list[int]:
    """The layers whose attention slides (OLMo-core's window pattern, resolved layer by layer)."""
    window, n = config.block.sequence_mixer.sliding_window, config.n_layers
    return [i for i in range(n) if window is not None and window.should_use_swa(i, n)]


def _windows(hf: PreTrainedConfig) -> dict[str, Any]:
    """HF `layer_types` (what its layers do; Qwen 3's derived by transformers from use_sliding_window and
    max_window_layers where it is unset) and `sliding_window` -> OLMo-core's pattern, one entry per layer."""
    kinds = list(hf.layer_types or [])
    if "sliding_attention" not in kinds:
        return {}
    if not hf.sliding_window or hf.sliding_window < 1:
        # Qwen 3's config holds no sliding_window where its use_sliding_window is false
        switch = f" (use_sliding_window={hf.use_sliding_window})" if hasattr(hf, "use_sliding_window") else ""
        raise ValueError(
            f"config.json: sliding_window={hf.sliding_window}{switch} must be a positive window size where "
            "layer_types has sliding_attention"
        )
    pattern = [hf.sliding_window if kind == "sliding_attention" else -1 for kind in kinds]
    window = SlidingWindowAttentionConfig(
        pattern=pattern, force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=False
    )
    return {"sliding_window": window}


def _layer_types(config: TransformerConfig) -> tuple[list[str], int | None]:
    """OLMo-core's windows -> HF `layer_types` and the one window size (None: no layer slides)."""
    window, sliding = config.block.sequence_mixer.sliding_window, sliding_layers(config)
    sizes = {window.get_window_size(i, config.n_layers) for i in sliding}
    if len(sizes) > 1:
        raise ShapeError("block.sequence_mixer.sliding_window.pattern", window.pattern, "one window size")
    kinds = ["sliding_attention" if i in sliding else "full_attention" for i in range(config.n_layers)]
    return kinds, sizes.pop() if sizes else None


def _olmo3_windows(config: TransformerConfig) -> dict[str, Any]:
    kinds, size = _layer_types(config)
    return {"layer_types": kinds, "sliding_window": size}


def _qwen3_windows(config: TransformerConfig) -> dict[str, Any]:
    """max_window_layers (read by transformers only where layer_types is unset) is the first sliding layer, or
    num_hidden_layers where none slides (as every Qwen 3 release states)."""
    kinds, size = _layer_types(config)
    first = kinds.index("sliding_attention") if size else len(kinds)
    return dict(
        use_sliding_window=size is not None, sliding_window=size, max_window_layers=first, layer_types=kinds
    )


def _no_windows(config: TransformerConfig) -> dict[str, Any]:
    if sliding_layers(config):
        window = config.block.sequence_mixer.sliding_window
        raise ShapeError("block.sequence_mixer.sliding_window", window, "no sliding window in Llama")
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
        ("intermediate_size",),
        lambda hf: {"feed_forward": FeedForwardConfig(hidden_size=hf.intermediate_size, bias=False)},
        lambda c: {"intermediate_size": c.block.feed_forward.hidden_size},
    ),
    Row(("rms_norm_eps",), lambda hf: {"layer_norm_eps": hf.rms_norm_eps}, _eps),
    _same("tie_word_embeddings", "tie_word_embeddings", "tie_word_embeddings"),
    _same("initializer_range", "init_std", "init_std"),
)
"""The rows every family has."""

_ROPE = Row(
    ("rope_parameters",),
    lambda hf: _rope(dict(hf.rope_parameters or {})),
    lambda c: {"rope_parameters": _rope_parameters(c)},
)
_OLMO_BIAS = Row(("attention_bias",), _no_attention_bias, _no_attention_bias_to_hf)
_PRE_NORM_ROWS = (
    Row(
        ("head_dim",),
        _head_dim,
        lambda c: {
            "head_dim": c.block.sequence_mixer.head_dim or c.d_model // c.block.sequence_mixer.n_heads
        },
    ),
    Row(
        ("attention_bias",),
        # biases on q, k, v and o, as OLMo-core's attention has them all with `bias` (dotted: set after build)
        lambda hf: {"block.sequence_mixer.bias": bool(hf.attention_bias)},
        lambda c: {"attention_bias": has_bias(c.block.sequence_mixer.bias)},
    ),
    _ROPE,
)
"""The rows Llama and Qwen 3 add."""

_HF_FREE = {
    "max_position_embeddings": "the training length: train_module.max_sequence_length of the checkpoint",
    "bos_token_id": "dataset.tokenizer of the checkpoint",
    "eos_token_id": "dataset.tokenizer of the checkpoint",
    "pad_token_id": "dataset.tokenizer of the checkpoint",
    "use_cache": "transformers' generation switch, no part of the model",
}

OLMO2 = Family(
    stock=Olmo2Config,
    repo=RepoOlmo2Config,
    core_model_type="olmo2",
    block=TransformerBlockType.reordered_norm,
    qk_norm=True,
    head_qk_norm=False,
    layer_norm=LayerNormType.rms,
    rope_full_precision=True,
    rows=(*_COMMON_ROWS, _OLMO_BIAS, _ROPE),
    hf_fixed={"hidden_act": "silu", "attention_dropout": 0.0},
    hf_free=_HF_FREE,
    refusal="not the Olmo 2 or Olmo 3 shape ({needs}); this converter writes olmo2, repo_olmo2, olmo3 and "
    "repo_olmo3 (and llama, qwen3 from a default block without q/k norms or with per-head ones)",
)
"""HF `olmo2` / `repo_olmo2` <-> OLMo-core (its `olmo2_*` presets): no layer slides."""

OLMO3 = replace(
    OLMO2,
    stock=Olmo3Config,
    repo=RepoOlmo3Config,
    core_model_type="olmo3",
    rows=(
        *_COMMON_ROWS,
        _OLMO_BIAS,
        Row(("rope_parameters",), _one_rope, _rope_per_layer_type),
        Row(("layer_types", "sliding_window"), _windows, _olmo3_windows),
    ),
)
"""HF `olmo3` / `repo_olmo3` <-> OLMo-core (its `olmo3_*` presets): Olmo 2 with sliding windows."""

LLAMA = Family(
    stock=LlamaConfig,
    repo=RepoLlamaConfig,
    core_model_type="llama",
    block=TransformerBlockType.default,
    qk_norm=False,
    head_qk_norm=False,
    layer_norm=LayerNormType.qwen_rms,
    rope_full_precision=False,
    rows=(*_COMMON_ROWS, *_PRE_NORM_ROWS, Row((), lambda hf: {}, _no_windows)),
    hf_fixed={"hidden_act": "silu", "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1},
    hf_free=_HF_FREE,
    refusal="not the Llama or Qwen 3 shape ({needs}); this converter writes llama, repo_llama, qwen3 and "
    "repo_qwen3 from a default (pre-norm) block",
)
"""HF `llama` / `repo_llama` <-> OLMo-core (its `llama3_*` presets: no q/k norm)."""

QWEN3 = replace(
    LLAMA,
    stock=Qwen3Config,
    repo=RepoQwen3Config,
    core_model_type="qwen3",
    qk_norm=True,
    head_qk_norm=True,
    rows=(
        *_COMMON_ROWS,
        *_PRE_NORM_ROWS,
        Row(
            ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers"),
            _windows,
            _qwen3_windows,
        ),
    ),
    hf_fixed={"hidden_act": "silu", "attention_dropout": 0.0},
)
"""HF `qwen3` / `repo_qwen3` <-> OLMo-core (its `qwen3_*` presets: RMS q/k norms over each head's head_dim)."""

FAMILIES = (OLMO2, OLMO3, LLAMA, QWEN3)
