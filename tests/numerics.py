"""Bounds for OLMo models and float64 ground truths (`float64_truth`); the bounds themselves, torch only, are
`tests.bounds` (re-exported here).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from olmo.config import ModelConfig
from olmo.model import OLMo, RMSLayerNorm, RotaryEmbedding
from torch import Tensor

from olmo_repo.rotation import rotate_reference

from .bounds import assert_within, rotation_magnitude, rotation_roundings

__all__ = [
    "assert_within",
    "float64_truth",
    "model_roundings",
    "rotation_magnitude",
    "rotation_roundings",
]


def model_roundings(config: ModelConfig, seq_len: int, batch_tokens: int | None = None) -> int:
    """Worst-case rounding count of the logits (forward) or, given `batch_tokens`, the gradients of an
    OLMo-2-shaped model: the reduction lengths along one block (att_proj, q/k norms, attn_out, the two
    post-norms, ff_proj and f_phi's input projections over d_model; scores over head_dim; the weighted sum
    over the sequence; ff_out over the MLP's hidden size; final_map over d_model/8) times the layers, plus
    the final norm and output projection. Backward mirrors the forward and adds the batch reduction of the
    weight gradients."""
    d, head_dim = config.d_model, config.d_model // config.n_heads
    hidden = (config.mlp_hidden_size or config.mlp_ratio * d) // 2  # SwiGLU: ff_out's input size
    block = 8 * d + head_dim + seq_len + hidden + d // 8
    forward = config.n_layers * block + 2 * d
    return forward if batch_tokens is None else 2 * forward + batch_tokens


def _rms_norm_float64(self: RMSLayerNorm, x: Tensor) -> Tensor:
    if x.dtype != torch.float64:
        return _STOCK_RMS(self, x)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    return x if self.weight is None else self.weight * x


def _rope_float64(self: RotaryEmbedding, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    if q.dtype != torch.float64:
        return _STOCK_ROPE(self, q, k)
    head_dim, key_len = q.shape[-1], k.shape[-2]
    inv_freq = 1.0 / self.config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    positions = torch.arange(key_len, dtype=torch.float64).expand(k.shape[0], 1, key_len)  # [B, 1, T_k]
    return rotate_reference(q, positions[..., key_len - q.shape[-2] :], inv_freq), rotate_reference(
        k, positions, inv_freq
    )


_STOCK_RMS, _STOCK_ROPE = RMSLayerNorm.forward, RotaryEmbedding.forward


@contextmanager
def float64_truth(model: OLMo) -> Iterator[OLMo]:
    """A float64 copy of `model` that computes in float64 throughout: OLMo's RMS norms and stock RoPE cast
    to fp32 internally, so inside this block they compute in float64 for float64 inputs (fp32 inputs take the
    stock path unchanged)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(RMSLayerNorm, "forward", _rms_norm_float64)
        m.setattr(RotaryEmbedding, "forward", _rope_float64)
        truth = copy.deepcopy(model).double()
        truth.set_activation_checkpointing(None)
        yield truth
