"""What an HF model does on the recipe's held-out text: its loss, and where its RePo layers put the tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import RepoError

__all__ = ["heldout_loss", "heldout_positions"]


def heldout_loss(model_dir: Path, ids: Any, window: int, batch: int = 8, positions: str = "learned") -> float:
    """Mean cross-entropy (nats per predicted token) of the HF model in `model_dir` over the non-overlapping
    `window`-token windows of `ids` (every token after the first of its window), in float32; its RePo layers
    rotating by `positions` (`modes.PositionSource`: learned, index or constant)."""
    import torch
    import torch.nn.functional as F

    from ...eval.loading import load_model

    x = _windows(ids, window)
    model = load_model(model_dir, window, positions=positions)
    total = 0.0
    with torch.no_grad():
        for rows in x.split(batch):
            logits = model(rows).logits[:, :-1].float()  # [B, window - 1, vocab]
            total += F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").item()
    return total / (x.shape[0] * (window - 1))


def heldout_positions(model_dir: Path, ids: Any, window: int, rows: int = 8) -> dict[str, dict]:
    """{layer: `spread` of its positions} of the HF model's RePo layers over the first `rows` windows of `ids`:
    the statistics the trainers log, on text no run trained on."""
    import torch

    from ...eval.loading import load_model
    from ...positions import spread

    model = load_model(model_dir, window)
    with torch.no_grad():
        positions = model(_windows(ids, window)[:rows], output_positions=True).positions
    return {str(layer): spread(z) for layer, z in sorted(positions.items())}


def _windows(ids: Any, window: int) -> Any:
    """ids as whole windows [n, window] (int64); `RepoError` for fewer tokens than one."""
    import numpy as np
    import torch

    n = len(ids) // window
    if n == 0:
        raise RepoError(f"fewer held-out tokens ({len(ids)}) than one window of {window}")
    return torch.from_numpy(np.asarray(ids[: n * window], dtype=np.int64)).view(n, window)
