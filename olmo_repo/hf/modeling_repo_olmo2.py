"""RePo on Hugging Face: transformers' Olmo2 whose attention rotates q and k by per-head real positions.

Deltas from `transformers.models.olmo2` (everything else is inherited unchanged):

- `RepoOlmo2Attention` (layers whose mode is `nope` or `repo`; `rope` layers keep the stock
  `Olmo2Attention`). In `repo` layers f_phi predicts one real position per head and token from the
  decoder layer's input x [B, T, d] (OLMo-2 is post-norm: the residual stream, which q/k/v also see),

      z = final_map( SiLU(gate_map(x)) * content_map(x) )        # [B, T, H] -> [B, H, T], fp32

  and q, k are rotated by z after the q/k norms with fp32 angles. `nope` layers do not rotate. Either way
  keys enter the KV cache already rotated (by their own positions), so cached decoding equals a full
  forward. The rotation uses the inverse frequencies and attention factor of the config's RoPE (default,
  linear or YaRN), from an `Olmo2RotaryEmbedding` of the layer's own, exactly as the stock RoPE layers do.
- `RepoOlmo2Model`: `Olmo2Model` with those attentions swapped in; `output_positions=True` adds the
  positions of every RePo layer to the output (`positions`: {layer id: [B, H, T] fp32}).
- `RepoOlmo2ForCausalLM`: `Olmo2ForCausalLM` over a `RepoOlmo2Model`, with the same `output_positions`.

This file, `configuration_repo_olmo2.py` and `rope.py` are copied into converted checkpoints as remote code,
so it imports only torch, transformers and its neighbours (relative imports). Inside the package,
`olmo_repo/hf/rope.py` re-exports `olmo_repo.rope`; in a checkpoint it is a copy of that file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torch import Tensor
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.olmo2.modeling_olmo2 import (
    Olmo2Attention,
    Olmo2ForCausalLM,
    Olmo2Model,
    Olmo2PreTrainedModel,
    Olmo2RotaryEmbedding,
    eager_attention_forward,
)

from .configuration_repo_olmo2 import RepoOlmo2Config
from .rope import f_phi, rotate_qk

__all__ = [
    "RepoOlmo2Attention",
    "RepoOlmo2CausalLMOutputWithPast",
    "RepoOlmo2ForCausalLM",
    "RepoOlmo2Model",
    "RepoOlmo2ModelOutputWithPast",
    "record_positions",
    "repo_attentions",
]


class RepoOlmo2Attention(Olmo2Attention):
    """Olmo2 attention of a `nope` or `repo` layer: q, k rotated by predicted positions, or not at all."""

    def __init__(self, config: RepoOlmo2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.pe_mode = config.layer_modes()[layer_idx]
        assert self.pe_mode != "rope", "rope layers keep the stock Olmo2Attention"
        if self.pe_mode == "repo":
            hidden = config.hidden_size // 8
            self.gate_map = nn.Linear(config.hidden_size, hidden, bias=False)
            self.content_map = nn.Linear(config.hidden_size, hidden, bias=False)
            self.final_map = nn.Linear(hidden, config.num_attention_heads, bias=False)
            # Same inv_freq / attention factor as the model's RoPE layers (non-persistent buffers).
            self.rotary_emb = Olmo2RotaryEmbedding(config)
            # Hook point, no parameters: `record_positions` reads the positions [B, H, T] that pass through.
            self.positions_out = nn.Identity()

    def predict_positions(self, hidden_states: Tensor) -> Tensor:
        """f_phi: x [B, T, d] -> positions [B, H, T], fp32 (float64 for a float64 model)."""
        return f_phi(hidden_states, self.gate_map.weight, self.content_map.weight, self.final_map.weight)

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        attention_mask: Tensor | None,
        cache: Cache | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """`Olmo2Attention.forward` with the rotation by `position_embeddings` (integer positions) replaced.

        Restated from transformers 5.24.0 (canary: `olmo_repo.upstream.transformers.CANARIES`), as is the
        read of the private `config._attn_implementation` below.
        """
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states)).view(hidden_shape).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_norm(self.k_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if self.pe_mode == "repo":
            positions = self.positions_out(self.predict_positions(hidden_states))  # [B, H, T]
            inv_freq, scale = self.rotary_emb.inv_freq, self.rotary_emb.attention_scaling
            q, k = rotate_qk(q, k, positions, inv_freq)
            if scale != 1.0:  # YaRN's attention factor, applied to cos/sin in the RoPE layers
                q, k = q * scale, k * scale

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
            **kwargs,
        )
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights  # [B, T, d]


def repo_attentions(model: nn.Module) -> list[RepoOlmo2Attention]:
    """The attentions of `model` that predict positions, in layer order."""
    return [m for m in model.modules() if isinstance(m, RepoOlmo2Attention) and m.pe_mode == "repo"]


@contextmanager
def record_positions(model: nn.Module) -> Iterator[dict[int, Tensor]]:
    """Collect {layer id: positions [B, H, T]} of every RePo attention in `model` while the block runs."""
    positions: dict[int, Tensor] = {}
    hooks = [
        m.positions_out.register_forward_hook(
            lambda _m, _args, out, i=m.layer_idx: positions.__setitem__(i, out)
        )
        for m in repo_attentions(model)
    ]
    try:
        yield positions
    finally:
        for hook in hooks:
            hook.remove()


def _forward_with_positions(
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
class RepoOlmo2ModelOutputWithPast(BaseModelOutputWithPast):
    """`BaseModelOutputWithPast` plus `positions`: {layer id: [B, H, T] fp32} of the RePo layers."""

    positions: dict[int, Tensor] | None = None


@dataclass
class RepoOlmo2CausalLMOutputWithPast(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus `positions`: {layer id: [B, H, T] fp32} of the RePo layers."""

    positions: dict[int, Tensor] | None = None


class RepoOlmo2PreTrainedModel(Olmo2PreTrainedModel):
    config: RepoOlmo2Config
    config_class = RepoOlmo2Config


class RepoOlmo2Model(RepoOlmo2PreTrainedModel, Olmo2Model):
    """`Olmo2Model` whose `nope`/`repo` layers use `RepoOlmo2Attention`."""

    def __init__(self, config: RepoOlmo2Config):
        super().__init__(config)
        for i, mode in enumerate(config.layer_modes()):
            if mode != "rope":  # the stock attention built by Olmo2DecoderLayer is replaced
                self.layers[i].self_attn = RepoOlmo2Attention(config, i)
        self.post_init()  # initialises only the new modules

    def forward(self, *args: Any, output_positions: bool | None = None, **kwargs: Any) -> Any:
        """`Olmo2Model.forward`; `output_positions=True` returns a `RepoOlmo2ModelOutputWithPast`."""
        return _forward_with_positions(
            super().forward, self, RepoOlmo2ModelOutputWithPast, output_positions, args, kwargs
        )


class RepoOlmo2ForCausalLM(RepoOlmo2PreTrainedModel, Olmo2ForCausalLM):
    """`Olmo2ForCausalLM` over a `RepoOlmo2Model`."""

    def __init__(self, config: RepoOlmo2Config):
        # Olmo2ForCausalLM.__init__ would build a stock Olmo2Model first; build the RePo one directly. Restated
        # from transformers 5.24.0 (canary: olmo_repo.upstream.transformers.CANARIES).
        Olmo2PreTrainedModel.__init__(self, config)
        self.model = RepoOlmo2Model(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, *args: Any, output_positions: bool | None = None, **kwargs: Any) -> Any:
        """`Olmo2ForCausalLM.forward`; `output_positions=True` returns a `RepoOlmo2CausalLMOutputWithPast`."""
        return _forward_with_positions(
            super().forward, self, RepoOlmo2CausalLMOutputWithPast, output_positions, args, kwargs
        )
