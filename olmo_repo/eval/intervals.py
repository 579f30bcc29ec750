"""The 95% interval of a NIAH score: how far a cell of `n` samples can be from the score of infinitely many.

A NIAH sample scores in [0, 1] (RULER's `string_match_all`: the share of the needle's values found; 0 or 1 for
the single- and multi-key variants). The Wilson score interval of the mean is exact in coverage for 0/1 scores up
to its normal approximation, and conservative for partial ones: a score in [0, 1] with mean p has a variance of
at most p (1 - p), the variance the interval assumes. Unlike mean +- 1.96 sd / sqrt(n), it does not collapse to
a point at 0 % or 100 % (20 samples all right: 84-100 %).

Over seeds (the position study's from-scratch models): the Wilson interval of the share of seeds that learned, the
one-sided Fisher exact test of one arm's share against another's, the smallest difference those seed counts detect,
and Student's t interval of a mean over seeds (scipy's distributions: the exact tests, not approximations).
"""

from __future__ import annotations

import functools
import math

__all__ = ["Z95", "detectable_difference", "fisher_greater", "t_interval", "wilson_interval"]

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson_interval(mean: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (low, high) of a mean score `mean` in [0, 1] over `n` samples."""
    if n < 1 or not 0.0 <= mean <= 1.0:
        raise ValueError(f"a mean in [0, 1] over at least one sample, not {mean} over {n}")
    z2 = z * z
    center = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At 0 and 1 the bound is the mean itself, exactly: rounding put it 1e-17 inside, and a plot's error bar
    # (mean - low) came out negative (a study's report failed on 0 of 3)
    low = 0.0 if mean == 0.0 else max(0.0, center - half)
    high = 1.0 if mean == 1.0 else min(1.0, center + half)
    return low, high


def fisher_greater(hits: int, n: int, other_hits: int, other_n: int) -> float:
    """The one-sided Fisher exact p-value that a share of `hits` in `n` exceeds one of `other_hits` in `other_n`
    by more than chance (the hypergeometric tail, conditioned on the margins)."""
    from scipy.stats import fisher_exact

    return float(
        fisher_exact([[hits, n - hits], [other_hits, other_n - other_hits]], alternative="greater").pvalue
    )


def detectable_difference(
    n: int, other_n: int, other_share: float, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The smallest true excess of a share over `other_share` (to a hundredth) that the one-sided Fisher exact
    test at `alpha` finds with probability `power` from `n` against `other_n` samples; inf when none up to a share
    of 1 does. Exact: the test's rejection region enumerated, its probability summed under the two binomials."""
    from scipy.stats import binom

    rejected = _rejected(n, other_n, alpha)
    other = binom.pmf(range(other_n + 1), other_n, other_share)
    for step in range(1, 101):
        share = other_share + step / 100
        if share > 1.0 + 1e-9:
            break
        this = binom.pmf(range(n + 1), n, min(share, 1.0))
        if sum(this[a] * other[b] for a, b in rejected) >= power:
            return step / 100
    return math.inf


@functools.cache
def _rejected(n: int, other_n: int, alpha: float) -> tuple[tuple[int, int], ...]:
    """The outcomes (hits, other hits) where the one-sided Fisher test rejects at `alpha` (a study's report asks
    for the same counts after every model)."""
    outcomes = ((a, b) for a in range(n + 1) for b in range(other_n + 1))
    return tuple((a, b) for a, b in outcomes if fisher_greater(a, n, b, other_n) < alpha)


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Student's t interval of the mean of `values` (at least two), as (low, high)."""
    from scipy.stats import t

    if len(values) < 2:
        raise ValueError(f"an interval of a mean needs at least two values, not {len(values)}")
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = float(t.ppf(0.5 + level / 2, len(values) - 1)) * sd / math.sqrt(len(values))
    return mean - half, mean + half
