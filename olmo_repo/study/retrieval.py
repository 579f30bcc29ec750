"""From scratch at tiny scale: RoPE, NoPE and RePo trained on a task where the context decides the answer, at one
length, and tested at that length and at 4x (with and without YaRN) with more distractors.

The task is multi-query associative recall among noise (the retrieval NIAH asks for, stripped to its core): a
sequence holds `pairs` key-value pairs at random places among noise tokens, then `queries` queries
`QUERY key value` of pairs drawn at random (with replacement); the model is scored on each value, which only the
pair earlier in the context can tell. The
test at 4x the length holds 4x the pairs (4x the distractors) and 4x the noise.

    BOS  n n k1 v1 n k2 v2 n n ... n k8 v8 n   QUERY k3 [v3]  QUERY k7 [v7]  ...     ([.]: scored)

The models are the project's own HF classes (`RepoLlamaForCausalLM`: RoPE, NoPE in every layer, or RePo from
layer n_layers // 3 with RoPE below, as the paper's 1B has it), trained by a plain AdamW loop on freshly drawn
batches, one thread each: what is measured is the position mode, at a size one core trains in minutes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ARMS", "Task", "TinyModel", "accuracy", "build", "train"]

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


def build(arm: str, shape: TinyModel, seed: int, yarn: int = 1) -> torch.nn.Module:
    """A fresh `RepoLlamaForCausalLM` of `arm`; `yarn` > 1: its RoPE (and RePo's rotation) YaRN-scaled by that
    factor from the training length."""
    from ..hf import RepoLlamaConfig, RepoLlamaForCausalLM

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.theta}
    if yarn > 1:
        rope = {**rope, "rope_type": "yarn", "factor": float(yarn),
                "original_max_position_embeddings": shape.task.length}  # fmt: skip
    modes = {"RoPE": {}, "NoPE": {"pe_mode": "nope"},
             "RePo": {"pe_mode": "repo", "pe_start_layer": shape.layers // 3}}  # fmt: skip
    config = RepoLlamaConfig(
        vocab_size=shape.task.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=shape.task.length * max(yarn, 1),
        rope_parameters=rope,
        tie_word_embeddings=True,
        initializer_range=0.02,
        **modes[arm],
    )
    torch.manual_seed(seed)
    return RepoLlamaForCausalLM(config)


def train(
    arm: str, shape: TinyModel, seed: int, progress: Callable[[int, float], None] | None = None
) -> tuple[torch.nn.Module, dict[str, float]]:
    """Train `arm` from scratch (AdamW (0.9, 0.95), weight decay 0.1, linear warm-up then cosine to 0, clipping
    1.0) on `shape.steps` fresh batches drawn with `seed`; returns the model (eval mode) and its final loss and
    wall time. `progress(step, loss)` every 100 steps."""
    model = build(arm, shape, seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=shape.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    start, losses = time.monotonic(), []
    for step in range(shape.steps):
        warm = min(1.0, (step + 1) / shape.warmup)
        for group in opt.param_groups:
            group["lr"] = shape.lr * warm * 0.5 * (1 + math.cos(math.pi * step / shape.steps))
        ids, targets = shape.task.batch(gen, shape.batch)
        logits = model(ids).logits  # [B, T, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if progress is not None and (step % 100 == 99 or step == shape.steps - 1):
            progress(step + 1, sum(losses[-100:]) / len(losses[-100:]))
    return model.eval(), {"loss": sum(losses[-100:]) / len(losses[-100:]), "wall_s": time.monotonic() - start}


@torch.no_grad()
def accuracy(model: torch.nn.Module, task: Task, n: int, seed: int) -> tuple[int, int]:
    """(right, scored) greedy answers of `model` on n test sequences of `task` drawn with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    right = scored = 0
    for rows in range(0, n, 50):
        ids, targets = task.batch(gen, min(50, n - rows))
        predicted = model(ids).logits.argmax(-1)
        asked = targets != -100
        right += int((predicted[asked] == targets[asked]).sum())
        scored += int(asked.sum())
    return right, scored
