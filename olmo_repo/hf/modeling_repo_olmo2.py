"""RePo on Hugging Face: transformers' Olmo2 whose attention rotates q and k by per-head real positions.

Deltas from `transformers.models.olmo2` (everything else is inherited unchanged):

- `RepoOlmo2Attention` (layers whose mode is `nope` or `repo`; `rope` layers keep the stock
  `Olmo2Attention`): `Olmo2Attention` with `RepoAttentionMixin`, a `RepoLayer` (`rope.py`) with the forward
  that rotates by its positions (shared with OLMo 3's attention in `modeling_repo_olmo3.py`). In `repo`
  layers f_phi predicts the positions from the attention's input x [B, T, d], which q, k and v also read
  (OLMo 2 norms after each sublayer, so this is the residual stream), and q, k are rotated by them after the
  q/k norms; `nope` layers do not rotate. Either way keys enter the KV cache already rotated (by their own
  positions), so cached decoding equals a full forward. The rotation uses the inverse frequencies and
  attention factor of the config's RoPE (default, linear, YaRN or Llama 3's), from an `Olmo2RotaryEmbedding`
  of the layer's own, exactly as the stock RoPE layers do. The config's `pe_blend` p blends the positions with
  the token index (`position_ids`, as the stock layers rotate by): (1 - p) z + p i, so at p = 1 a RePo layer
  is the stock RoPE layer; `pe_positions` replaces them by the index or by none (ablations at evaluation).
- `RepoOlmo2DecoderLayer`: `Olmo2DecoderLayer` whose attention is that one in `nope`/`repo` layers
  (`RepoDecoderLayerMixin`).
- `RepoOlmo2Model`: `Olmo2Model` over those decoder layers (`RepoDecoderMixin`); `output_positions=True` adds the
  positions of every RePo layer to the output (`positions`: {layer id: [B, H_kv, T] fp32}).
- `RepoOlmo2ForCausalLM`: `Olmo2ForCausalLM` over a `RepoOlmo2Model` (`RepoCausalLMMixin`), with the same
  `output_positions`.

Each class states its changed submodule the way transformers' modular model files do (`modular_olmo2.py`'s
`Olmo2DecoderLayer`: the parent's `__init__`, then the submodule of its own): the decoder layer its attention, the
decoder its layers, the causal LM its decoder. Weight names are the stock ones (`model.layers.N.self_attn.*`),
f_phi's beside them. `from_pretrained` builds on the meta device, so the parent's modules cost nothing there.

The four mixins hold all of it; OLMo 3's, Llama's and Qwen 3's classes (`modeling_repo_olmo3.py`,
`modeling_repo_llama.py`, `modeling_repo_qwen3.py`) are the same mixins over transformers' Olmo3, Llama and
Qwen3, each stating only how its attention projects q, k and v (`RepoAttentionMixin.project_qkv`).

This file, `configuration_repo_olmo2.py`, `rope.py` (with its `rotation.py`) and `modes.py` are copied into
converted checkpoints as remote code, so it imports only torch, transformers and its neighbours (relative
imports). Inside the package, `olmo_repo/hf/rope.py` re-exports `olmo_repo.rope`; in a checkpoint it is a copy
of that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torch import Tensor
from transformers.cache_utils import Cache
from transformers.configuration_utils import PretrainedConfig
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.olmo2.modeling_olmo2 import (
    Olmo2Attention,
    Olmo2DecoderLayer,
    Olmo2ForCausalLM,
    Olmo2Model,
    Olmo2PreTrainedModel,
    Olmo2RotaryEmbedding,
    eager_attention_forward,
)

from .configuration_repo_olmo2 import RepoOlmo2Config
from .modes import PositionMode, layer_modes
from .rope import RepoLayer, record_positions

__all__ = [
    "RepoAttentionMixin",
    "RepoCausalLMOutputWithPast",
    "RepoCausalLMMixin",
    "RepoDecoderLayerMixin",
    "RepoDecoderMixin",
    "RepoModelOutputWithPast",
    "RepoOlmo2Attention",
    "RepoOlmo2DecoderLayer",
    "RepoOlmo2ForCausalLM",
    "RepoOlmo2Model",
    "forward_with_positions",
    "heads",
]


def heads(x: Tensor, head_dim: int) -> Tensor:
    """[..., T, H * head_dim] -> [..., T, H, head_dim] (a view)."""
    return x.view(*x.shape[:-1], -1, head_dim)


class RepoAttentionMixin(RepoLayer):
    """The attention of a `nope` or `repo` layer: q, k rotated by predicted positions, or not at all. Mixed into
    transformers' attention class of the model (`Olmo2Attention`; `Olmo3Attention` and `Qwen3Attention`, which
    add a sliding window; `LlamaAttention`), whose projections, norms and attention call it keeps: a family
    states only how it projects q, k and v (`project_qkv`)."""

    rotary_class: type[nn.Module] = Olmo2RotaryEmbedding
    """The model's RoPE module, whose frequencies a `repo` layer rotates its positions with."""
    sliding_window: int | None = None
    """The layer's attention window (the sliding-window layers of Olmo3 and Qwen3 set it), passed to the attention
    function."""

    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        mode = layer_modes(config)[layer_idx]
        assert mode != PositionMode.rope, "rope layers keep the stock attention"
        self.init_repo(
            mode,
            layer_id=layer_idx,
            d_model=config.hidden_size,
            n_kv_heads=config.num_key_value_heads,
            head_dim=self.head_dim,
            index_blend=config.pe_blend,
            position_source=config.pe_positions,
        )
        if mode == PositionMode.repo:
            # The model's RoPE (non-persistent buffers, which transformers initialises like the stock ones).
            self.rotary_emb = self.rotary_class(config)

    def rope_frequencies(self, device: Any) -> tuple[Tensor, float]:
        """The config's RoPE (default, linear, YaRN or Llama 3's): its inverse frequencies and attention factor."""
        return self.rotary_emb.inv_freq, self.rotary_emb.attention_scaling

    def project_qkv(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, T, hd], k and v [B, H_kv, T, hd] from the attention's input, as the family's stock forward
        computes them before its rotation. This is OLMo 2/3's: the q/k RMSNorms span all heads, so they come
        before the split into heads. Llama (no q/k norm) and Qwen 3 (a norm per head, after the split)
        override it; nothing else of the forward differs between the families."""
        q = self.q_norm(self.q_proj(hidden_states))
        k = self.k_norm(self.k_proj(hidden_states))
        v = self.v_proj(hidden_states)
        q, k, v = (heads(x, self.head_dim).transpose(1, 2) for x in (q, k, v))
        return q, k, v

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        attention_mask: Tensor | None,
        cache: Cache | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """The stock attention forward with the rotation by `position_embeddings` (integer positions) replaced.

        Restated from transformers 5.24.0's `Olmo2Attention.forward`, `Olmo3Attention.forward`,
        `LlamaAttention.forward` and `Qwen3Attention.forward`, which differ only in how q, k and v are projected
        (`project_qkv`) and in the sliding window (`sliding_window`: None where the stock forward passes none),
        and whose eager fallbacks (`eager_attention_forward`) are the same function (canaries:
        `olmo_repo.upstream.transformers.CANARIES`), as is the read of the private `config._attn_implementation`
        below.
        """
        input_shape = hidden_states.shape[:-1]
        q, k, v = self.project_qkv(hidden_states)  # [B, H(_kv), T, hd]

        # f_phi reads what q, k and v read: the attention's input (OLMo 2/3: the residual stream; Llama, Qwen 3:
        # the normed hidden state). The token index (the index blend's, and `pe_positions: index`) is the stock
        # RoPE's: position_ids [B, T], absolute under a cache, counted from a left-padded prompt's first token.
        q, k = self.reposition(hidden_states, q, k, index=kwargs.get("position_ids"))  # [B, H(_kv), T, hd]

        cache = cache if cache is not None else kwargs.pop("past_key_values", None)  # transformers < 5.24
        if cache is not None:  # keys are cached rotated
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, weights = attention_interface(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights  # [B, T, d]


class RepoOlmo2Attention(RepoAttentionMixin, Olmo2Attention):
    """Olmo2 attention of a `nope` or `repo` layer."""


def forward_with_positions(
    forward: Any, model: nn.Module, output_cls: type, output_positions: bool | None, args: Any, kwargs: Any
) -> Any:
    """Run the parent `forward`; with `output_positions`, return `output_cls` with `positions` set."""
    if not output_positions:
        return forward(*args, **kwargs)
    return_dict = kwargs.pop("return_dict", True)
    with record_positions(model) as positions:
        out = forward(*args, return_dict=True, **kwargs)
    out = output_cls(**out, positions=positions)
    return out if return_dict else out.to_tuple()


@dataclass
class RepoModelOutputWithPast(BaseModelOutputWithPast):
    """`BaseModelOutputWithPast` plus `positions`: {layer id: [B, H_kv, T] fp32} of the RePo layers (every
    family's decoder: the stock outputs are shared across families too)."""

    positions: dict[int, Tensor] | None = None


@dataclass
class RepoCausalLMOutputWithPast(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus `positions`: {layer id: [B, H_kv, T] fp32} of the RePo layers."""

    positions: dict[int, Tensor] | None = None


class RepoDecoderLayerMixin:
    """A decoder layer of transformers' (`Olmo2DecoderLayer`, `Olmo3DecoderLayer`, `LlamaDecoderLayer`,
    `Qwen3DecoderLayer`) whose attention is `attention_class` in a `nope` or `repo` layer; a `rope` layer is the
    stock one."""

    attention_class: type[nn.Module]

    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        if layer_modes(config)[layer_idx] != PositionMode.rope:
            self.self_attn = self.attention_class(config, layer_idx)


class RepoDecoderMixin:
    """The decoder of a RePo model, mixed into transformers' (`Olmo2Model`, `Olmo3Model`, `LlamaModel`,
    `Qwen3Model`): its layers are `layer_class`'s, and `output_positions=True` returns `output_class` (the stock
    output plus `positions`)."""

    layer_class: type[nn.Module]
    output_class: type[BaseModelOutputWithPast] = RepoModelOutputWithPast

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        # The config validated its keys when it was made; `from_pretrained(dir, pe_blend=...)` sets overrides
        # after that, unchecked.
        config.validate_position_modes()
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.post_init()  # initialises the new layers

    def forward(self, *args: Any, output_positions: bool | None = None, **kwargs: Any) -> Any:
        """The stock decoder's forward; `output_positions=True` returns an `output_class`."""
        return forward_with_positions(
            super().forward, self, self.output_class, output_positions, args, kwargs
        )


class RepoCausalLMMixin:
    """The causal LM of a RePo model, mixed into transformers' (`Olmo2ForCausalLM`, `Olmo3ForCausalLM`,
    `LlamaForCausalLM`, `Qwen3ForCausalLM`) over `decoder_class`, and `output_positions=True` returns
    `output_class`."""

    decoder_class: type[nn.Module]
    output_class: type[CausalLMOutputWithPast] = RepoCausalLMOutputWithPast

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.model = self.decoder_class(config)
        self.post_init()  # initialises the new decoder; ties the output projection to its embedding if asked

    def forward(self, *args: Any, output_positions: bool | None = None, **kwargs: Any) -> Any:
        """The stock forward; `output_positions=True` returns an `output_class`."""
        return forward_with_positions(
            super().forward, self, self.output_class, output_positions, args, kwargs
        )


class RepoOlmo2PreTrainedModel(Olmo2PreTrainedModel):
    config: RepoOlmo2Config
    config_class = RepoOlmo2Config


class RepoOlmo2DecoderLayer(RepoDecoderLayerMixin, Olmo2DecoderLayer):
    """`Olmo2DecoderLayer` whose attention is `RepoOlmo2Attention` in `nope`/`repo` layers."""

    attention_class = RepoOlmo2Attention


class RepoOlmo2Model(RepoDecoderMixin, RepoOlmo2PreTrainedModel, Olmo2Model):
    """`Olmo2Model` over `RepoOlmo2DecoderLayer`s."""

    layer_class = RepoOlmo2DecoderLayer


class RepoOlmo2ForCausalLM(RepoCausalLMMixin, RepoOlmo2PreTrainedModel, Olmo2ForCausalLM):
    """`Olmo2ForCausalLM` over a `RepoOlmo2Model`."""

    decoder_class = RepoOlmo2Model
