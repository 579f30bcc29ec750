"""Side-by-side ratios of the benchmarks: within-round ratios, their median and a bootstrap 95% interval.

A round measures every variant moments apart, so drift of a shared machine cancels in the ratio within the
round; the ratio of overall medians would keep it.
"""

from __future__ import annotations

import random
import statistics


def within_round(samples: list[float], baseline: list[float]) -> list[float]:
    """samples[i] / baseline[i] for each round i."""
    return [a / b for a, b in zip(samples, baseline, strict=True)]


def median_ci(values: list[float], resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap 95% interval of the median."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
