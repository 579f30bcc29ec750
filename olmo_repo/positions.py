"""The statistics of the positions RePo layers predict: `spread` of positions [..., T] (what reports, the explorer
and the evaluation's pattern analysis print) and `position_stats`, the training metrics both trainers log with
it (`modes.POSITIONS_METRIC`), one rule for what they mean. The metrics file they land in is
`olmo_repo.metrics`'s (standard library only: its readers load no torch)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch import Tensor

from .modes import INDEX_BLEND_METRIC, POSITIONS_METRIC
from .rope import observe_positions, repo_layers

__all__ = ["position_stats", "spread"]


@contextmanager
def position_stats(model: nn.Module) -> Iterator[dict[str, float]]:
    """The training metrics of the positions (`modes.POSITIONS_METRIC` with each of `modes.POSITION_STATS` per
    RePo layer; `modes.INDEX_BLEND_METRIC` while a blend is on) of the first forward of each RePo layer of
    `model` while the block runs: the first micro-batch of a step, later ones and activation-checkpoint
    recomputations left out. A tensor-parallel layer's positions are gathered first. Both trainers log these,
    one rule for what they mean."""
    stats: dict[str, float] = {}
    layers = repo_layers(model)
    if layers and layers[0].index_blend > 0:
        stats[INDEX_BLEND_METRIC] = layers[0].index_blend

    def record(layer: int, z: Tensor) -> None:  # z [B, H_kv, T]
        key = lambda stat: POSITIONS_METRIC.format(layer=layer, stat=stat)  # noqa: E731
        if key("std") in stats:
            return
        z = (z.full_tensor() if hasattr(z, "full_tensor") else z).detach().float()  # DTensor under TP
        stats.update({key(stat): value for stat, value in spread(z).items()})

    with observe_positions(model, record):
        yield stats


def spread(z: Tensor) -> dict[str, float]:
    """`modes.POSITION_STATS` of positions z [..., T]: min, max, std, 5th and 95th percentile of every value,
    and Spearman's rank correlation of each row with the token index 0..T-1, averaged over the rows (a row
    of equal values counts 0)."""
    z = z.detach().float()
    flat = z.flatten()
    if flat.numel() > 1 << 24:  # torch.quantile's limit: an even subsample
        flat = flat[:: flat.numel() // (1 << 24) + 1]
    p05, p95 = torch.quantile(flat, torch.tensor([0.05, 0.95], device=flat.device)).tolist()
    rows = z.reshape(-1, z.shape[-1])  # [rows, T]
    ranks = rows.argsort(-1).argsort(-1).float()
    ranks = ranks - ranks.mean(-1, keepdim=True)
    steps = torch.arange(rows.shape[-1], device=z.device, dtype=torch.float32)
    steps = steps - steps.mean()
    denom = ranks.norm(dim=-1) * steps.norm()
    corr = torch.where(denom > 0, (ranks * steps).sum(-1) / denom.clamp_min(1e-30), 0.0)
    constant = rows.amax(-1) == rows.amin(-1)  # argsort ranks ties in index order: not an ordering
    corr = torch.where(constant, 0.0, corr)
    return {
        "min": z.min().item(),
        "max": z.max().item(),
        "std": z.std().item() if z.numel() > 1 else 0.0,
        "p05": p05,
        "p95": p95,
        "rank_corr": corr.mean().item(),
    }
