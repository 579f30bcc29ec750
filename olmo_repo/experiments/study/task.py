"""The from-scratch study's task and models' shape, as data (torch is imported where batches are drawn).

The task is multi-query associative recall among noise (the retrieval NIAH asks for, stripped to its core): a
sequence holds `pairs` key-value pairs at random places among noise tokens, then `queries` queries
`QUERY key value` of pairs drawn at random (with replacement); the model is scored on each value, which only the
pair earlier in the context can tell. The test at 4x the length holds 4x the pairs (4x the distractors) and 4x
the noise.

    BOS  n n k1 v1 n k2 v2 n n ... n k4 v4 n   QUERY k3 [v3]  QUERY k1 [v1]  ...     ([.]: scored)

The noise has a grammar, as text has: with probability `rule` a noise token is a fixed function of the token two
places back, whatever that token is, so the noise after a pair `k v` is what its key k calls for. The models are
trained on the answers and on every noise token from the third (-100 elsewhere). Why: recall takes two steps (a
head that carries k forward to v's position, then one that matches the query's key with it), and nothing
rewards the first before the second exists; the grammar rewards carrying the token before v forward on its own.
Measured on this machine (4 pairs in 64 tokens, 3,000 steps of 32 sequences, seed 0): on grammarless noise
2-layer RoPE models stayed at 28% of the answers (the one-in-four guess among the context's values); with a
grammar on the noise alone (the token two back being noise) a 3-layer one stayed at 29% (and 2-layer ones broke
through in one run of four); with this grammar the 3-layer RoPE model answered 100% (its loss on the answers
under 0.02 from step 1,000 on).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["ARMS", "BOS", "LEARNED", "QUERY", "TESTS", "Arm", "Task", "TinyModel"]

BOS, QUERY = 1, 2
GRAMMAR_SEED = 12_345  # the noise's rule is the task's, the same in every sequence, model and seed


@dataclass(frozen=True)
class Task:
    """The recall task's vocabulary and shapes (the defaults are the study's)."""

    keys: int = 32
    values: int = 32
    noise: int = 32
    length: int = 64
    pairs: int = 4
    queries: int = 8
    rule: float = 0.8

    @property
    def vocab(self) -> int:
        return 8 + self.keys + self.values + self.noise

    def scaled(self, length: int, pairs: int) -> Task:
        """The task `length` times longer with `pairs` times the key-value pairs (the distractors); the rest of
        the body is noise."""
        return Task(**{**asdict(self), "length": self.length * length, "pairs": self.pairs * pairs})

    def batch(self, gen: torch.Generator, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """n sequences [n, length], their targets [n, length] (the next token where the task says what it may
        be, -100 elsewhere: the answers, and every noise token from the third, the grammar's domain) and the
        answers [n, length] (True where the target is a queried value: what the study scores)."""
        import torch  # here, not above: the study's options and its command's --help read this module

        k0, v0, n0 = 8, 8 + self.keys, 8 + self.keys + self.values
        body = self.length - 1 - 3 * self.queries  # where the pairs go: 1..body
        if (body - 1) // 2 < self.pairs or self.pairs > self.keys:
            raise ValueError(f"{self}: too short for its pairs and queries")
        ids = torch.randint(n0, n0 + self.noise, (n, self.length), generator=gen)
        ids[:, 0] = BOS
        keys = _distinct(gen, n, self.keys, self.pairs) + k0  # [n, pairs]
        values = torch.randint(v0, v0 + self.values, (n, self.pairs), generator=gen)
        starts = 1 + 2 * _distinct(gen, n, (body - 1) // 2, self.pairs)  # non-overlapping pair slots
        ids.scatter_(1, starts, keys)
        ids.scatter_(1, starts + 1, values)
        noise = ids >= n0
        # the grammar: a noise token follows from the token two back (any token: after a pair "k v" comes the
        # noise its key k calls for, which rewards carrying k forward to v, the first half of recall)
        grammar = torch.Generator().manual_seed(GRAMMAR_SEED)
        follows = torch.randint(n0, n0 + self.noise, (self.vocab,), generator=grammar)  # token -> noise token
        ruled = noise & (torch.rand(n, self.length, generator=gen) < self.rule)
        for t in range(2, 1 + body):
            ids[:, t] = torch.where(ruled[:, t], follows[ids[:, t - 2]], ids[:, t])
        # [n, queries], drawn with replacement: asking every pair once would let the last answers follow by
        # elimination (the values not asked yet) instead of retrieval
        asked = torch.randint(0, self.pairs, (n, self.queries), generator=gen)
        at = 1 + body + 3 * torch.arange(self.queries)  # QUERY tokens
        ids[:, at] = QUERY
        ids[:, at + 1] = keys.gather(1, asked)
        ids[:, at + 2] = values.gather(1, asked)
        answers = torch.zeros_like(ids, dtype=torch.bool)
        answers[:, at + 1] = True  # the value, predicted at its key's position
        text = torch.zeros_like(answers)
        text[:, 1:-1] = (ids >= n0)[:, 2:]  # every noise token from the third, the grammar's domain
        targets = torch.full_like(ids, -100)
        targets[:, :-1] = ids[:, 1:]
        return ids, targets.masked_fill(~(answers | text), -100), answers


def _distinct(gen: torch.Generator, n: int, k: int, m: int) -> Tensor:
    """n rows of m distinct integers from range(k), in random order."""
    import torch

    return torch.rand(n, k, generator=gen).argsort(-1)[:, :m]


@dataclass(frozen=True)
class TinyModel:
    """The models' shape and training (the defaults are the study's)."""

    layers: int = 3
    hidden: int = 64
    heads: int = 4
    mlp: int = 128
    theta: float = 10_000.0
    steps: int = 5000
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 100
    task: Task = field(default_factory=Task)


@dataclass(frozen=True)
class Arm:
    """A from-scratch model: its position mode, where it applies, its knobs, and its share of the study's seeds.

    Matched by construction (`retrieval.build` and `train`): for one seed, every arm starts from the same weights
    wherever it shares a tensor with the others (f_phi's own are drawn from a stream apart, so adding f_phi
    changes nothing else), reads the same batches, and is tested on the same sequences."""

    key: str
    """Its name in the study's folder (`scratch-{key}-{seed}`) and in the figures."""
    label: str
    mode: str
    """`pe_mode` of the layers it selects: rope, nope or repo."""
    upper: bool = True
    """True: the layers from n_layers // 3 up, RoPE below (RePo's layers in the paper's 1B); False: every layer."""
    seeds: float = 1.0
    """Its share of the study's seed count (rounded up): 1 for RePo and its matched control."""
    against: str | None = None
    """The arm whose learned fraction it is tested against (one-sided: does this one learn more often?)."""
    lr_multiplier: float = 1.0
    """f_phi's learning rate over the model's."""
    blend: float = 0.0
    """The index blend: p falls linearly from 1 (RePo layers start as RoPE) to 0 over this fraction of the steps."""
    zero_final: bool = False
    """f_phi's last layer (final_map) at zero at init, so every position starts at 0 (the layers start as NoPE).
    An option of the study's tiny models only."""
    steps: float = 1.0
    """Its training steps over the study's (`TinyModel.steps`). The warm-up and the final fifth's decay keep their
    shape, so a longer arm holds the peak rate longer and its first 80% of the study's steps are the study's."""

    def seed_count(self, seeds: int) -> int:
        return max(1, math.ceil(seeds * self.seeds - 1e-9))

    def shaped(self, shape: TinyModel) -> TinyModel:
        """`shape` with this arm's steps."""
        return replace(shape, steps=round(shape.steps * self.steps))


ARMS = (
    Arm("repo", "RePo", "repo", against="nope-above"),
    Arm("nope-above", "NoPE in RePo's layers", "nope"),
    Arm("rope", "RoPE", "rope", upper=False, seeds=0.5),
    Arm("nope", "NoPE in every layer", "nope", upper=False, seeds=0.5, against="rope"),
    Arm("repo-lr10", "RePo, f_phi lr x10", "repo", seeds=0.25, against="repo", lr_multiplier=10.0),
    Arm(
        "repo-blend", "RePo, index blend over the first fifth", "repo", seeds=0.25, against="repo", blend=0.2
    ),
    Arm(
        "repo-zero", "RePo, f_phi's last layer 0 at init", "repo", seeds=0.25, against="repo", zero_final=True
    ),
    Arm("repo-long", "RePo, 3x the steps", "repo", seeds=0.25, against="repo", steps=3.0),
)
"""The arms, RePo and its matched control (NoPE in RePo's layers, RoPE below: the model without f_phi) first;
RoPE and NoPE in every layer with half the seeds; RePo's knobs with a quarter; RePo for 3x the steps with a
quarter (added once the first models had learned late in their 5,000 steps: docs/research.md)."""

LEARNED = 0.9
"""A model learned the recall when it answers at least this share of the queries at the training length: fixed
before the study's runs (docs/research.md)."""

TESTS = {  # name -> (length factor, pairs factor, YaRN factor)
    "1x": (1, 1, 1),
    "4x": (4, 4, 1),
    "4x, YaRN": (4, 4, 4),
    "8x": (8, 8, 1),
    "8x, YaRN": (8, 8, 8),
    "1x, 2x pairs": (1, 2, 1),
    "1x, 4x pairs": (1, 4, 1),
}
"""Where each model is tested: at the training length; at 4x and 8x the length with as many times the pairs,
as trained and with YaRN (its factor from the training length) in its RoPE layers and RePo's rotation (NoPE has
no rotation to scale); and at the training length with 2x and 4x the pairs (the distractors), less noise."""
