"""What the learned positions look like: chunk patterns (constant / monotonic / hybrid) and spans.

The paper's analysis cuts each head's position sequence into consecutive chunks of 16 tokens and calls a
chunk, with eps = 0.2,

    constant    if max - min <= 2 * eps
    monotonic   else, if every consecutive difference has the same sign (all > 0 or all < 0)
    hybrid      otherwise

(it reports 22% constant, 4% monotonic, the rest hybrid). A sequence of T >= chunk tokens gives
floor(T / chunk) chunks: the remainder of fewer than `chunk` tokens is left out, so every chunk counted has
the same length. A sequence shorter than `chunk` is one chunk of all its tokens; a single token is constant.

The span of a head is max - min of its positions over the tokens: how much of the context's length the
positions use (the paper: it grows with the context but stays far below it).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["PATTERNS", "pattern_counts", "patterns_by_layer", "position_patterns", "position_spans"]

PATTERNS = ("constant", "monotonic", "hybrid")


def _check(positions: Tensor) -> Tensor:
    if positions.ndim < 1 or positions.shape[-1] == 0:
        raise ValueError(
            f"positions need a token axis with at least one token; got shape {tuple(positions.shape)}"
        )
    if not torch.isfinite(positions).all():
        raise ValueError("positions contain NaN or infinite values")
    return positions.detach().to(torch.float64)


def pattern_counts(positions: Tensor, chunk: int = 16, eps: float = 0.2) -> Tensor:
    """Number of constant, monotonic and hybrid chunks (int64 [3]) in positions [..., T] (e.g. [B, H, T])."""
    if chunk < 1 or eps < 0:
        raise ValueError(f"chunk must be >= 1 and eps >= 0; got chunk={chunk}, eps={eps}")
    z = _check(positions)
    T = z.shape[-1]
    size = min(chunk, T)
    chunks = z[..., : T - T % size].reshape(-1, size)  # [N, size]: one row per chunk of every sequence
    constant = chunks.amax(-1) - chunks.amin(-1) <= 2 * eps
    diffs = chunks.diff(dim=-1)  # [N, size - 1]
    monotonic = ~constant & ((diffs > 0).all(-1) | (diffs < 0).all(-1))
    hybrid = ~constant & ~monotonic
    return torch.stack([constant.sum(), monotonic.sum(), hybrid.sum()])


def _fractions(counts: Tensor) -> dict[str, float]:
    total = int(counts.sum())
    return {name: int(n) / total for name, n in zip(PATTERNS, counts)}


def position_patterns(positions: Tensor, chunk: int = 16, eps: float = 0.2) -> dict[str, float]:
    """Fractions of constant, monotonic and hybrid chunks over every sequence of positions [..., T].

    Returns {"constant": f, "monotonic": f, "hybrid": f}, summing to 1. NaN or infinite positions are refused.
    """
    return _fractions(pattern_counts(positions, chunk, eps))


def patterns_by_layer(
    positions: Mapping[int, Tensor], chunk: int = 16, eps: float = 0.2
) -> dict[int | str, dict[str, float]]:
    """`position_patterns` per layer ({layer: [B, H, T]}), plus "all": every chunk of every layer pooled."""
    if not positions:
        raise ValueError("no positions given (the model has no RePo layer?)")
    counts = {layer: pattern_counts(z, chunk, eps) for layer, z in sorted(positions.items())}
    out: dict[int | str, dict[str, float]] = {layer: _fractions(c) for layer, c in counts.items()}
    out["all"] = _fractions(torch.stack(list(counts.values())).sum(0))
    return out


def position_spans(positions: Tensor) -> Tensor:
    """max - min over the tokens of positions [..., T]: [...] (e.g. [B, H]), float64."""
    z = _check(positions)
    return z.amax(-1) - z.amin(-1)
