"""The from-scratch study's task and models' shape, as data (torch is imported where batches are drawn).

The task is multi-query associative recall among noise (the retrieval NIAH asks for, stripped to its core): a
sequence holds `pairs` key-value pairs at random places among noise tokens, then `queries` queries
`QUERY key value` of pairs drawn at random (with replacement); the model is scored on each value, which only the
pair earlier in the context can tell. The test at 4x the length holds 4x the pairs (4x the distractors) and 4x
the noise.

    BOS  n n k1 v1 n k2 v2 n n ... n k8 v8 n   QUERY k3 [v3]  QUERY k7 [v7]  ...     ([.]: scored)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["ARMS", "BOS", "QUERY", "Task", "TinyModel"]

BOS, QUERY = 1, 2
ARMS = ("RoPE", "NoPE", "RePo")
"""The position modes compared: RoPE in every layer, NoPE in every layer, RePo above the lower third."""


@dataclass(frozen=True)
class Task:
    """The recall task's vocabulary and shapes (the defaults are the study's)."""

    keys: int = 32
    values: int = 32
    noise: int = 64
    length: int = 64
    pairs: int = 8
    queries: int = 8

    @property
    def vocab(self) -> int:
        return 8 + self.keys + self.values + self.noise

    def scaled(self, factor: int) -> Task:
        """The same task `factor` times longer, with `factor` times the pairs (distractors) and the noise."""
        return Task(**{**asdict(self), "length": self.length * factor, "pairs": self.pairs * factor})

    def batch(self, gen: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        """n sequences [n, length] and their targets [n, length]: the next token where it is a queried value,
        -100 (not scored) elsewhere."""
        import torch  # here, not above: the study's options and its command's --help read this module

        k0, v0, n0 = 8, 8 + self.keys, 8 + self.keys + self.values
        ids = torch.randint(n0, n0 + self.noise, (n, self.length), generator=gen)
        ids[:, 0] = BOS
        body = self.length - 1 - 3 * self.queries  # where the pairs go: 1..body
        if (body - 1) // 2 < self.pairs or self.pairs > self.keys:
            raise ValueError(f"{self}: too short for its pairs and queries")
        keys = _distinct(gen, n, self.keys, self.pairs) + k0  # [n, pairs]
        values = torch.randint(v0, v0 + self.values, (n, self.pairs), generator=gen)
        starts = 1 + 2 * _distinct(gen, n, (body - 1) // 2, self.pairs)  # non-overlapping pair slots
        ids.scatter_(1, starts, keys)
        ids.scatter_(1, starts + 1, values)
        # [n, queries], drawn with replacement: asking every pair once would let the last answers follow by
        # elimination (the values not asked yet) instead of retrieval
        asked = torch.randint(0, self.pairs, (n, self.queries), generator=gen)
        at = 1 + body + 3 * torch.arange(self.queries)  # QUERY tokens
        ids[:, at] = QUERY
        ids[:, at + 1] = keys.gather(1, asked)
        ids[:, at + 2] = values.gather(1, asked)
        targets = torch.full_like(ids, -100)
        targets[:, at + 1] = values.gather(1, asked)  # predicted at the key's position
        return ids, targets


def _distinct(gen: torch.Generator, n: int, k: int, m: int) -> Tensor:
    """n rows of m distinct integers from range(k), in random order."""
    import torch

    return torch.rand(n, k, generator=gen).argsort(-1)[:, :m]


@dataclass(frozen=True)
class TinyModel:
    """The models' shape and training (the defaults are the study's)."""

    layers: int = 3
    hidden: int = 96
    heads: int = 4
    mlp: int = 256
    theta: float = 10_000.0
    steps: int = 2000
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 100
    task: Task = field(default_factory=Task)
