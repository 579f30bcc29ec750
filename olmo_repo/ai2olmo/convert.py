"""The exact maps between this project's OLMo models and Hugging Face Olmo2: configs and weights.

No arithmetic: `att_proj` rows are (q, k, v); `ff_proj` halves are (up, gate); `attn_norm`/`ff_norm` are
HF's post-attention/post-feedforward norms. `olmo_repo.hf.files.check_state_dict` compares every key and shape
with the model a config builds, so a wrong mapping fails loudly.
"""

from __future__ import annotations

import re

import torch
from olmo.config import ActivationType, BlockType, LayerNormType, ModelConfig
from torch import Tensor
from tqdm import tqdm
from transformers import Olmo2Config, Olmo3Config

from ..errors import command
from ..hf.configuration_repo_olmo2 import RepoOlmo2Config
from ..modes import F_PHI_WEIGHTS, PositionMode, index_blend, layer_modes
from .config import RepoModelConfig

__all__ = [
    "hf_config_from_olmo",
    "hf_state_dict_from_olmo",
    "olmo_config_from_hf",
    "olmo_state_dict_from_hf",
]

# Per-layer weights that map one to one: OLMo name -> HF name (under `model.layers.{i}.`).
_LAYER_KEYS = {
    "attn_out.weight": "self_attn.o_proj.weight",
    "q_norm.weight": "self_attn.q_norm.weight",
    "k_norm.weight": "self_attn.k_norm.weight",
    "attn_norm.weight": "post_attention_layernorm.weight",
    "ff_norm.weight": "post_feedforward_layernorm.weight",
    "ff_out.weight": "mlp.down_proj.weight",
    **{f"{name}.weight": f"self_attn.{name}.weight" for name in F_PHI_WEIGHTS},
}
# Fused OLMo weights: their row blocks, in order, and the HF names of the blocks.
_FUSED_KEYS = {
    "att_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "ff_proj.weight": ("mlp.up_proj.weight", "mlp.gate_proj.weight"),
}
_TOP_KEYS = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "transformer.ff_out.weight": "lm_head.weight",
}
_OLMO_BLOCK = re.compile(r"transformer\.blocks\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _check_olmo2_shape(config: ModelConfig) -> None:
    """Raise a ValueError naming the first OLMo setting that HF's Olmo2 cannot express."""
    required = {
        "norm_after": (config.norm_after, True),
        "attention_layer_norm": (config.attention_layer_norm, True),
        "layer_norm_type": (config.layer_norm_type, LayerNormType.rms),
        "layer_norm_with_affine": (config.layer_norm_with_affine, True),
        "attention_layer_norm_with_affine": (config.attention_layer_norm_with_affine, True),
        "include_bias": (config.include_bias, False),
        "bias_for_layer_norm": (bool(config.bias_for_layer_norm), False),
        "activation_type": (config.activation_type, ActivationType.swiglu),
        "block_type": (config.block_type, BlockType.sequential),
        "block_group_size": (config.block_group_size, 1),
        "rope": (config.rope, True),
        "alibi": (config.alibi, False),
        "clip_qkv": (config.clip_qkv, None),
        "scale_logits": (config.scale_logits, False),
        "embedding_layer_norm": (config.embedding_layer_norm, False),
    }
    for key, (value, allowed) in required.items():
        if value != allowed:
            raise ValueError(f"model.{key}={value} has no Hugging Face Olmo2 equivalent; allowed: {allowed}")


def hf_config_from_olmo(config: ModelConfig, step: int = 0) -> Olmo2Config:
    """The HF config of an OLMo-2-shaped model: `Olmo2Config` if every layer is RoPE, else `RepoOlmo2Config`,
    which records the index blend's schedule and scores with its p after `step` optimizer steps (the
    checkpoint's), as training did at that step."""
    _check_olmo2_shape(config)
    mlp_hidden = config.mlp_hidden_size or config.mlp_ratio * config.d_model
    kwargs = dict(
        vocab_size=config.embedding_size or config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=mlp_hidden // 2,  # SwiGLU: ff_proj gives (up, gate), each half of mlp_hidden
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.effective_n_kv_heads,
        max_position_embeddings=config.max_sequence_length,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        rms_norm_eps=config.layer_norm_eps,
        tie_word_embeddings=config.weight_tying,
        bos_token_id=None,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        initializer_range=config.init_std,
        attention_dropout=config.attention_dropout,
    )
    if all(mode == PositionMode.rope for mode in layer_modes(config)):
        return Olmo2Config(**kwargs)
    init, steps = config.pe_blend_init, config.pe_blend_steps
    return RepoOlmo2Config(
        **kwargs,
        pe_mode=str(config.pe_mode),
        pe_start_layer=config.pe_start_layer,
        pe_layer_ids=list(config.pe_layer_ids) if config.pe_layer_ids is not None else None,
        pe_blend_init=float(init),
        pe_blend_steps=steps,
        pe_blend=index_blend(init, steps, step),
    )


def olmo_config_from_hf(config: Olmo2Config, vocab_size: int | None = None) -> RepoModelConfig:
    """The OLMo model config of an HF Olmo2/RepoOlmo2 config. `vocab_size`: the tokenizer's (defaults to the
    embedding size, which is HF's `vocab_size`)."""
    if isinstance(config, Olmo3Config):
        raise ValueError(
            f"model_type={config.model_type!r}: OLMo 3's sliding-window layers (layer_types) have no ai2-olmo "
            f"0.6.0 counterpart; train it with OLMo-core ({command('core_convert_from_hf')}, docs/olmo-core.md)"
        )
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"rope_parameters.rope_type={rope['rope_type']!r} has no OLMo equivalent; allowed: default "
            "(YaRN and other scalings are an inference-time setting of the HF model)"
        )
    if config.hidden_act != "silu" or config.attention_bias:
        raise ValueError(
            f"hidden_act={config.hidden_act!r}, attention_bias={config.attention_bias} have no OLMo-2 equivalent; "
            "allowed: silu, false"
        )
    for name in ("eos_token_id", "pad_token_id"):
        if not isinstance(getattr(config, name), int | None):
            raise ValueError(f"{name}={getattr(config, name)!r} must be one token id for OLMo")
    theta = float(rope.get("rope_theta", 10_000.0))
    if not theta.is_integer():
        raise ValueError(
            f"rope_parameters.rope_theta={theta} must be an integer for OLMo (model.rope_theta: int)"
        )
    pe = {}
    if isinstance(config, RepoOlmo2Config):  # the schedule, not the p it scores with: a new run starts at 0
        pe = dict(
            pe_mode=config.pe_mode,
            pe_start_layer=config.pe_start_layer,
            pe_layer_ids=config.pe_layer_ids,
            pe_blend_init=float(getattr(config, "pe_blend_init", 0.0)),
            pe_blend_steps=getattr(config, "pe_blend_steps", 0),
        )
    n_kv = config.num_key_value_heads
    return RepoModelConfig(
        d_model=config.hidden_size,
        n_heads=config.num_attention_heads,
        n_kv_heads=None if n_kv == config.num_attention_heads else n_kv,
        n_layers=config.num_hidden_layers,
        mlp_hidden_size=2 * config.intermediate_size,
        activation_type=ActivationType.swiglu,
        block_type=BlockType.sequential,
        rope=True,
        rope_theta=int(theta),
        attention_layer_norm=True,
        norm_after=True,
        layer_norm_type=LayerNormType.rms,
        layer_norm_with_affine=True,
        attention_layer_norm_with_affine=True,
        layer_norm_eps=config.rms_norm_eps,
        bias_for_layer_norm=False,
        include_bias=False,
        weight_tying=config.tie_word_embeddings,
        max_sequence_length=config.max_position_embeddings,
        vocab_size=vocab_size or config.vocab_size,
        embedding_size=config.vocab_size,
        eos_token_id=config.eos_token_id if config.eos_token_id is not None else 0,
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0,
        attention_dropout=config.attention_dropout,
        residual_dropout=0.0,
        embedding_dropout=0.0,
        init_device="cpu",
        init_fn="normal",
        init_std=config.initializer_range,
        init_cutoff_factor=3,
        **pe,
    )


def hf_state_dict_from_olmo(state_dict: dict[str, Tensor], config: Olmo2Config) -> dict[str, Tensor]:
    """OLMo names -> HF names. Fused weights are split into separate tensors (copies, for safetensors)."""
    q_rows = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    kv_rows = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    splits = {"att_proj.weight": [q_rows, kv_rows, kv_rows], "ff_proj.weight": [config.intermediate_size] * 2}
    out: dict[str, Tensor] = {}
    for key, tensor in tqdm(state_dict.items(), desc="mapping OLMo -> HF", unit="tensor"):
        if key in _TOP_KEYS:
            out[_TOP_KEYS[key]] = tensor
            continue
        match = _OLMO_BLOCK.fullmatch(key)
        if match is None:
            raise KeyError(f"OLMo weight {key!r} has no Hugging Face equivalent")
        prefix, name = f"model.layers.{match[1]}.", match[2]
        if name in _FUSED_KEYS:
            for hf_name, part in zip(_FUSED_KEYS[name], tensor.split(splits[name], dim=0), strict=True):
                out[prefix + hf_name] = part.clone()
        elif name in _LAYER_KEYS:
            out[prefix + _LAYER_KEYS[name]] = tensor
        else:
            raise KeyError(f"OLMo weight {key!r} has no Hugging Face equivalent")
    return out


def olmo_state_dict_from_hf(state_dict: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """HF names -> OLMo names; the fused OLMo weights are concatenated back (exact)."""
    top = {hf: olmo for olmo, hf in _TOP_KEYS.items()}
    per_layer = {hf: olmo for olmo, hf in _LAYER_KEYS.items()}
    out: dict[str, Tensor] = {}
    for key, tensor in state_dict.items():
        if key in top:
            out[top[key]] = tensor
        elif (match := _HF_LAYER.fullmatch(key)) and match[2] in per_layer:
            out[f"transformer.blocks.{match[1]}.{per_layer[match[2]]}"] = tensor
        elif not (match and any(match[2] in parts for parts in _FUSED_KEYS.values())):
            raise KeyError(f"Hugging Face weight {key!r} has no OLMo equivalent")
    for i in tqdm(range(n_layers), desc="mapping HF -> OLMo", unit="layer"):
        for olmo_name, hf_names in _FUSED_KEYS.items():
            parts = [state_dict.get(f"model.layers.{i}.{name}") for name in hf_names]
            if any(p is None for p in parts):
                raise KeyError(f"layer {i}: {olmo_name} needs {', '.join(hf_names)}")
            out[f"transformer.blocks.{i}.{olmo_name}"] = torch.cat(parts, dim=0)
    return out
