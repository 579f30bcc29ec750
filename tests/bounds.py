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

import math

import torch
from torch import Tensor

__all__ = ["assert_within", "logprob_bound", "rotation_magnitude", "rotation_roundings"]


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


def rotation_roundings(positions: Tensor, inv_freq: Tensor) -> float:
    """Rounding count of one rotated element, in units of eps * rotation_magnitude(x): the angle z * f is
    rounded to eps * |angle| radians (moving the result by as much), cos and sin are within 2 ulp, and the
    two products and their sum round 3 times."""
    return (positions.detach().abs().max() * inv_freq.abs().max()).item() + 5


def rotation_magnitude(x: Tensor) -> Tensor:
    """|x1| + |x2| of each rotated pair (split halves), on both halves: [..., d]."""
    x1, x2 = x.detach().double().abs().chunk(2, dim=-1)
    return torch.cat((x1 + x2, x1 + x2), dim=-1)


def logprob_bound(n_layers: int, mlp_width: int, max_logit: float, max_pos: float = 0.0) -> float:
    """|log p - log p'| allowed between two fp32 computations of one model that order their sums differently
    (vLLM and HF; two processes under FSDP and one): each of the `n_layers` layers adds relative errors of about
    eps * sqrt(K) from its sums of K terms (K up to the MLP width, `mlp_width`) and eps * |z| from rotating by
    angles of size |z| (RePo's real positions, up to `max_pos`); the logits (up to `max_logit`) scale that to
    absolute error, the log-softmax at most doubles it. A safety factor 4 covers the constants that this does not
    count. A mean of log-probs (a cross-entropy loss) is within the same bound."""
    eps = torch.finfo(torch.float32).eps
    return 4 * 2 * eps * max(max_logit, 1.0) * n_layers * (math.sqrt(mlp_width) + max_pos)
