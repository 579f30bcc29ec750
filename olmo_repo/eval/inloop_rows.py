"""In-loop RULER NIAH without a trainer: the rows (prompt + answer), the metric, each rank's batches, the names.

`olmo_repo.ai2olmo.niah` (ai2-olmo's evaluator) and `olmo_repo.olmocore.niah` (OLMo-core's) read the same rows
with the same metric under the same names; `olmo_repo.ai2olmo.niah`'s docstring says what is scored and how it is
sharded. No trainer is imported here.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchmetrics import Metric

from .variants import PROMPTS

__all__ = ["PROMPTS", "RANK_CANDIDATES", "NiahMetric", "RankBatches", "Row", "niah_rows"]

RANK_CANDIDATES = 4  # gold + 3 distractors: all of niah_multikey_1's, a seeded draw of the needle haystacks'
_GOLD, _TOKENS, _EXACT = 0, 1, 2  # columns of a row's stats: sum of log-probs, scored tokens, all argmax


@dataclass(frozen=True)
class Row:
    """One sequence to read: a prompt with a candidate answer (the gold one or a distractor value)."""

    sample: int
    gold: bool
    tokens: list[int]  # prompt + answer, <= length
    scored: list[int]  # indices into `tokens` of the answer tokens that overlap a value


def _answer(hf: Any, values: list[str], prompt_tokens: list[int], sample: int, gold: bool) -> Row:
    """The row of a prompt read with " v1, v2, ..." as its answer (tokenized on its own, as lm-eval's and
    OLMo's ICL tasks tokenize a continuation)."""
    text, spans = "", []
    for value in values:
        text += " " if not text else ", "
        spans.append((len(text), len(text) + len(value)))
        text += value
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    scored = [
        len(prompt_tokens) + i
        for i, (start, end) in enumerate(enc.offset_mapping)
        if any(start < e and end > s for s, e in spans)
    ]
    return Row(sample, gold, prompt_tokens + list(enc.input_ids), scored)


def _distractors(sample: Any, value_type: str, seed: int) -> list[str]:
    """The values of the prompt's needles that are not gold, in text order, drawn down to
    RANK_CANDIDATES - 1 by the sample's own generator when there are more."""
    needle = re.escape(f"One of the special magic {value_type} for ") + r".+? is: ([0-9a-f-]+)\."
    found = dict.fromkeys(re.findall(needle, sample.input))  # unique, in text order
    others = [v for v in found if v not in sample.answers]
    if len(others) > RANK_CANDIDATES - 1:
        rng = random.Random(f"niah-inloop/{seed}/{sample.variant}/{sample.length}/{sample.index}")
        others = sorted(rng.sample(others, RANK_CANDIDATES - 1), key=others.index)
    return others


def niah_rows(hf: Any, variant: str, length: int, prompts: int, seed: int) -> list[Row]:
    """Every row of an entry: per prompt the gold row, then (multikey variants) one row per distractor.
    Raises ValueError (from `niah_samples`) when the tokenizer cannot fit the prompts in `length`."""
    from . import niah  # lm-eval's RULER code: imported only by runs that name a NIAH evaluator

    spec = niah.VARIANTS[variant]
    rows = []
    for s in niah.niah_samples(hf, variant, length, prompts, seed):
        prompt_tokens = list(hf(s.prompt, add_special_tokens=False).input_ids)
        mine = [_answer(hf, s.answers, prompt_tokens, s.index, True)]
        if spec.num_keys > 1 or spec.haystack == "needle":  # the prompt holds values that are not gold
            mine += [
                _answer(hf, [d], prompt_tokens, s.index, False) for d in _distractors(s, spec.value, seed)
            ]
        if (longest := max(len(r.tokens) for r in mine)) > length:
            raise ValueError(f"{variant}: a prompt with its answer takes {longest} tokens, past {length}")
        rows += mine
    return rows


class NiahMetric(Metric):
    """Per row: sum of the value tokens' log-probs, their count and whether all are the argmax; summed over
    ranks (each row is read on one rank) and turned into the entry's metrics at `compute`."""

    full_state_update = False

    def __init__(self, rows: list[Row]) -> None:
        super().__init__()
        samples = sorted({r.sample for r in rows})
        where = {s: i for i, s in enumerate(samples)}
        gold = torch.full((len(samples),), -1, dtype=torch.long)
        others: list[list[int]] = [[] for _ in samples]
        for i, r in enumerate(rows):
            if r.gold:
                gold[where[r.sample]] = i
            else:
                others[where[r.sample]].append(i)
        width = max(map(len, others))
        self.gold = gold  # [S] row of each prompt's gold answer
        self.others = torch.tensor([o + [-1] * (width - len(o)) for o in others], dtype=torch.long)  # [S, D]
        self.add_state("stats", default=torch.zeros(len(rows), 3, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, batch: dict[str, Any], logits: Tensor) -> None:
        # logits [B, T, V] predict token t + 1 at position t
        for b, row in enumerate(batch["niah_row"].tolist()):
            if row < 0:  # padding row
                continue
            at = batch["niah_scored"][b].nonzero().squeeze(-1)  # [K] positions of scored tokens
            targets = batch["input_ids"][b, at]  # [K]
            logp = logits[b, at - 1].float().log_softmax(-1)  # [K, V]
            token_logp = logp.gather(-1, targets[:, None]).squeeze(-1)  # [K]
            exact = bool((logp.argmax(-1) == targets).all())
            self.stats[row] += torch.tensor(
                [token_logp.sum().item(), len(at), float(exact)],
                dtype=torch.float64,
                device=self.stats.device,
            )

    def compute(self) -> dict[str, Tensor]:
        stats = self.stats  # [rows, 3], summed over ranks
        gold = stats[self.gold.to(stats.device)]  # [S, 3]
        out = {
            "exact_match": gold[:, _EXACT].mean(),
            "logprob": (gold[:, _GOLD] / gold[:, _TOKENS]).mean(),
        }
        if self.others.shape[1] > 0:
            others = self.others.to(stats.device)
            scores = torch.where(others >= 0, stats[others.clamp(min=0), _GOLD], -torch.inf)  # [S, D]
            out["rank_acc"] = (gold[:, _GOLD] > scores.max(-1).values).double().mean()
        return out


class RankBatches(Dataset):
    """This rank's batches: global batch k, rows k * batch_size on (at most `batch_size`; the last holds what is
    left), runs on rank k % world_size. A rank reads as many batches as the others: one past the rows is a single
    padding row. A batch's rows and shape do not depend on the world size, so every layout scores the same."""

    def __init__(
        self, rows: list[Row], batch_size: int, length: int, pad: int, rank: int, world: int
    ) -> None:
        n_batches = -(-len(rows) // batch_size)
        n_batches = -(-n_batches // world) * world  # every rank reads as many batches
        self.rows, self.batch_size, self.length, self.pad = rows, batch_size, length, pad
        self.mine = list(range(rank, n_batches, world))

    def __len__(self) -> int:
        return len(self.mine)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        first = self.mine[i] * self.batch_size
        ids = list(range(first, min(first + self.batch_size, len(self.rows)))) or [-1]
        input_ids = torch.full((len(ids), self.length), self.pad, dtype=torch.long)  # [B, L]
        scored = torch.zeros((len(ids), self.length), dtype=torch.bool)  # [B, L]
        for b, j in enumerate(ids):
            row = self.rows[max(j, 0)]  # a padding row repeats row 0 with weight zero
            input_ids[b, : len(row.tokens)] = torch.tensor(row.tokens)
            scored[b, row.scored] = True
        return {"input_ids": input_ids, "niah_row": torch.tensor(ids), "niah_scored": scored}
