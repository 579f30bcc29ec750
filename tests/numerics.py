"""Tolerances from the dtype's epsilon and the magnitudes involved, checked against float64 ground truths.

A float computation differs from exact arithmetic by rounding errors whose size follows from eps and the
magnitudes that are added up, not from what one machine produced: inductor-compiled and vectorised kernels
order float operations differently on AVX2 and AVX-512 (and GPUs), so a tolerance read off one CPU fails on
another. Every bound here is

    |actual - truth| <= roundings * eps(actual's dtype) * magnitude

where `roundings` is a worst-case count of rounding errors (Higham: a sum of n terms is off by at most about
n * eps * the sum of their magnitudes, so reduction lengths add up along a computation) and `magnitude` is the
scale of the terms involved, elementwise where it is known, else the largest |truth| of the tensor.
Comparing two low-precision results with each other doubles `roundings` (each is within it of the truth).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from olmo.config import ModelConfig
from olmo.model import OLMo, RMSLayerNorm, RotaryEmbedding
from torch import Tensor

from olmo_repo.rope import rotate_reference

__all__ = [
    "assert_within",
    "float64_truth",
    "model_roundings",
    "rotation_magnitude",
    "rotation_roundings",
]


def assert_within(
    actual: Tensor,
    truth: Tensor,
    *,
    roundings: float,
    magnitude: Tensor | float | None = None,
    eps: float | None = None,
    what: str = "result",
) -> None:
    """Assert |actual - truth| <= roundings * eps * magnitude elementwise (eps: actual's dtype by default;
    magnitude: the largest |truth| by default). The message names `what`, the worst element and the bound."""
    assert actual.shape == truth.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(truth.shape)}"
    eps = torch.finfo(actual.dtype).eps if eps is None else eps
    truth = truth.detach().double()
    if magnitude is None:
        magnitude = truth.abs().max()
    bound = (roundings * eps * torch.as_tensor(magnitude, dtype=torch.float64)).expand_as(truth)
    error = (actual.detach().double() - truth).abs()
    if not (error <= bound).all():  # NaN fails too
        worst = torch.nan_to_num((error / bound), nan=math.inf).argmax()
        index = tuple(int(i) for i in torch.unravel_index(worst, truth.shape))
        raise AssertionError(
            f"{what}: |actual - truth| = {error[index].item():.3g} at {index} exceeds the bound "
            f"{roundings:.0f} roundings x eps {eps:.3g} x magnitude = {bound[index].item():.3g} "
            f"(max error {error.max().item():.3g})"
        )


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


def rotation_roundings(positions: Tensor, inv_freq: Tensor) -> float:
    """Rounding count of one rotated element, in units of eps * rotation_magnitude(x): the angle z * f is
    rounded to eps * |angle| radians (moving the result by as much), cos and sin are within 2 ulp, and the
    two products and their sum round 3 times."""
    return (positions.detach().abs().max() * inv_freq.abs().max()).item() + 5


def rotation_magnitude(x: Tensor) -> Tensor:
    """|x1| + |x2| of each rotated pair (split halves), on both halves: [..., d]."""
    x1, x2 = x.detach().double().abs().chunk(2, dim=-1)
    return torch.cat((x1 + x2, x1 + x2), dim=-1)


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
