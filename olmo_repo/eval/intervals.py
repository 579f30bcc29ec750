"""The 95% interval of a NIAH score: how far a cell of `n` samples can be from the score of infinitely many.

A NIAH sample scores in [0, 1] (RULER's `string_match_all`: the share of the needle's values found; 0 or 1 for
the single- and multi-key variants). The Wilson score interval of the mean is exact in coverage for 0/1 scores up
to its normal approximation, and conservative for partial ones: a score in [0, 1] with mean p has a variance of
at most p (1 - p), the variance the interval assumes. Unlike mean +- 1.96 sd / sqrt(n), it does not collapse to
a point at 0 % or 100 % (20 samples all right: 84-100 %).
"""

from __future__ import annotations

import math

__all__ = ["Z95", "wilson_interval"]

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson_interval(mean: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (low, high) of a mean score `mean` in [0, 1] over `n` samples."""
    if n < 1 or not 0.0 <= mean <= 1.0:
        raise ValueError(f"a mean in [0, 1] over at least one sample, not {mean} over {n}")
    z2 = z * z
    center = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, center - half), min(1.0, center + half)
