"""The RePo block: OLMo's sequential block whose attention rotates q and k by per-head real positions.

Deltas from `olmo.model.OLMoSequentialBlock` (everything else is inherited unchanged):

- f_phi (RePo layers only, `olmo_repo.rope.f_phi`): one real position per head and token from the block
  input x [B, T, d_model], with gate_map, content_map: d_model -> d_model/8 and final_map: d_model/8 ->
  n_heads, no bias, OLMo's normal init; fp32 results (see `olmo_repo.rope`).
- `attention()` rotates q and k by those positions (RePo) or not at all (NoPE), after the q/k norms and
  *before* the KV cache, so cached keys are already rotated by their own positions (stock OLMo caches
  unrotated keys and re-rotates them by integer index, which a learned position cannot be).
- The positions reach `attention()` in its attention-bias argument (`_BiasAndPositions`), which the stock
  `forward` passes through untouched, also into its fine-grained activation-checkpoint call: the
  recomputation in backward sees the same positions, and nothing is stored on `self`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
from olmo.config import ModelConfig
from olmo.initialization import init_normal
from olmo.model import BufferCache, OLMoSequentialBlock
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .config import PositionMode, layer_modes
from .rope import f_phi, inv_frequencies, rotate_qk

__all__ = ["RepoSequentialBlock", "predict_positions"]

KVCache = tuple[Tensor, Tensor]


class _BiasAndPositions(NamedTuple):
    bias: Tensor | None
    positions: Tensor | None  # [B, H, T] fp32, RePo layers only


class RepoSequentialBlock(OLMoSequentialBlock):
    """A sequential block in `nope` or `repo` mode (rope layers stay stock `OLMoSequentialBlock`s)."""

    def __init__(self, layer_id: int, config: ModelConfig, cache: BufferCache):
        super().__init__(layer_id, config, cache)
        self.pe_mode = layer_modes(config)[layer_id]
        assert self.pe_mode != PositionMode.rope, "rope layers are stock OLMoSequentialBlocks"
        if self.pe_mode == PositionMode.repo:
            hidden = config.d_model // 8
            # nn.Linear, not bare Parameters: OLMo's optimizer grouping and FSDP expect modules.
            self.gate_map = nn.Linear(config.d_model, hidden, bias=False, device=config.init_device)
            self.content_map = nn.Linear(config.d_model, hidden, bias=False, device=config.init_device)
            self.final_map = nn.Linear(hidden, config.n_heads, bias=False, device=config.init_device)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.pe_mode == PositionMode.repo:
            for linear in (self.gate_map, self.content_map, self.final_map):
                init_normal(
                    linear, std=self.config.init_std, init_cutoff_factor=self.config.init_cutoff_factor
                )

    def predict_positions(self, x: Tensor) -> Tensor:
        """f_phi: block input x [B, T, d_model] -> positions [B, n_heads, T], fp32 (float64 for a float64 model)."""
        mixed = x.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled(x.device.type)
        if not (mixed and torch.is_grad_enabled()):
            return self._f_phi(x)
        # In mixed precision autograd would keep a low-precision copy of x and f_phi's fp32 activations,
        # up to 2x the block input's memory per RePo layer; recomputing them in backward is ~1% of its FLOPs.
        return checkpoint(self._f_phi, x, use_reentrant=False)

    def _f_phi(self, x: Tensor) -> Tensor:
        return f_phi(x, self.gate_map.weight, self.content_map.weight, self.final_map.weight)

    def forward(
        self,
        x: Tensor,
        attention_bias: Tensor | None = None,
        layer_past: KVCache | None = None,
        use_cache: bool = False,
        max_doc_len: int | None = None,
        cu_doc_lens: Tensor | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        positions = self.predict_positions(x) if self.pe_mode == PositionMode.repo else None
        bias = _BiasAndPositions(attention_bias, positions)
        return super().forward(x, bias, layer_past, use_cache, max_doc_len, cu_doc_lens)  # type: ignore[arg-type]

    def attention(  # type: ignore[override]
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attention_bias: _BiasAndPositions,
        layer_past: KVCache | None = None,
        use_cache: bool = False,
        max_doc_len: int | None = None,
        cu_doc_lens: Tensor | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        bias, positions = attention_bias
        B, T, C = q.size()
        head_dim = C // self.config.n_heads
        n_kv = self.config.effective_n_kv_heads
        dtype = k.dtype
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q).to(dtype), self.k_norm(k).to(dtype)
        q = q.view(B, T, self.config.n_heads, head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, n_kv, head_dim).transpose(1, 2)  # [B, H_kv, T, hd]
        v = v.view(B, T, n_kv, head_dim).transpose(1, 2)

        if positions is not None:
            inv_freq = inv_frequencies(head_dim, self.config.rope_theta, q.device)
            q, k = rotate_qk(q, k, positions, inv_freq)

        if layer_past is not None:  # cached keys are already rotated
            k = torch.cat((layer_past[0], k), dim=-2)
            v = torch.cat((layer_past[1], v), dim=-2)
        present = (k, v) if use_cache else None

        if bias is not None:
            query_len, key_len = q.shape[-2], k.shape[-2]
            bias = self._cast_attn_bias(bias[:, :, key_len - query_len : key_len, :key_len], dtype)
        att = self._scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=bias,
            dropout_p=0.0 if not self.training else self.config.attention_dropout,
            is_causal=bias is None,
            max_doc_len=max_doc_len,
            cu_doc_lens=cu_doc_lens,
        )
        att = att.transpose(1, 2).contiguous().view(B, T, C)  # [B, T, d_model]
        return self.attn_out(att), present


@torch.no_grad()
def predict_positions(model: nn.Module, input_ids: Tensor, **forward_kwargs) -> dict[int, Tensor]:
    """Run `model` on input_ids [B, T] and return {layer id: positions [B, n_heads, T] fp32} of its RePo layers.

    Hooks read each RePo block's input and apply its f_phi, so what comes back is what the forward used.
    """
    positions: dict[int, Tensor] = {}
    blocks = [
        m for m in model.modules() if isinstance(m, RepoSequentialBlock) and m.pe_mode == PositionMode.repo
    ]
    hooks = [
        b.register_forward_pre_hook(
            lambda b, args: positions.__setitem__(b.layer_id, b.predict_positions(args[0]))
        )
        for b in blocks
    ]
    try:
        model(input_ids, **forward_kwargs)
    finally:
        for h in hooks:
            h.remove()
    return positions
