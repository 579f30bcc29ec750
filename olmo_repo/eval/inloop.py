"""In-loop RULER NIAH: a retrieval evaluator that OLMo's Trainer runs every `eval_interval` steps.

A config names it like any other in-loop evaluator, one entry per variant (`olmo_repo.eval.niah.VARIANTS`):

    evaluators:
      - label: niah_multikey_1          # at the run's model.max_sequence_length
        type: downstream
      - label: niah_single_1@2048       # at 2048 tokens (at most model.max_sequence_length)
        type: downstream
        prompts: 20                     # default: PROMPTS

The prompts are `niah.niah_samples(tokenizer, variant, length, prompts, seed)` with the run's tokenizer; the
entry's `prompts` key (`olmo_repo.config.RepoEvaluatorConfig`) sets their number (default `PROMPTS`), its
`data.seed` overrides RULER's seed (`RULER_SEED`): the same prompts as `scripts/eval.py`, built once at
start, with no draw from any global RNG. No generation: each prompt is read once with its gold answer
appended (teacher forcing), padded on the right to `length` tokens (static shapes; causal attention makes the
padding invisible to the tokens before it). The answer is RULER's gold values, " v1, v2, ..." in RULER's
answer order (the query order for multiquery, the text order for multivalue); only the tokens that overlap
a value are scored, the space and separators are context. Metrics, per entry:

    eval/{label}/exact_match   fraction of prompts whose every value token is the argmax given the prompt and
                               the gold tokens before it (greedy decoding would write the values)
    eval/{label}/logprob       mean over prompts of the mean log-probability of the value tokens
    eval/{label}/rank_acc      multikey variants only (the others hold no value but the gold ones): fraction of
                               prompts where the gold value has a higher total log-probability than each of up
                               to RANK_CANDIDATES - 1 distractor values of the same prompt, each read as the
                               answer in its own row (a tie counts as wrong)

Sharding: the rows (prompt + answer or distractor) are cut into batches of `device_eval_batch_size` rows
(default: the training micro-batch, since rows are as long as training instances); batch k runs on rank
k % world_size, the batch count padded to a multiple of the world size with rows of weight zero (FSDP needs
the same number of forwards on every rank). Each row's numbers land in its own slot of a [rows, 3] float64
state, zero on every other rank, which torchmetrics sums over ranks at `compute`: the result is that of one
process that reads the same batches.

`install()` routes OLMo's evaluator building (`olmo_repo.upstream.olmo.route_evaluator_build`) so that a
`type: downstream` entry whose label starts with `niah_` builds this evaluator; the train command calls it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from olmo.config import EvaluatorConfig, EvaluatorType, TrainConfig
from olmo.eval import Evaluator
from olmo.exceptions import OLMoConfigurationError
from olmo.tokenizer import Tokenizer
from olmo.torch_util import get_global_rank, get_world_size
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchmetrics import Metric

from ..upstream.olmo import STOCK_EVALUATOR_BUILD, route_evaluator_build
from .variants import RULER_SEED

__all__ = [
    "PREFIX",
    "PROMPTS",
    "RANK_CANDIDATES",
    "NiahEvaluator",
    "NiahMetric",
    "build_evaluator",
    "install",
    "metric_name",
    "niah_rows",
]

PREFIX = "niah_"
PROMPTS = 100
"""Prompts per variant. All eight variants at the training length then cost a small share of the training
FLOPs between two calls of the official 1B config (README, "In-loop NIAH", counts it)."""
RANK_CANDIDATES = 4  # gold + 3 distractors: all of niah_multikey_1's, a seeded draw of the needle haystacks'
_GOLD, _TOKENS, _EXACT = 0, 1, 2  # columns of a row's stats: sum of log-probs, scored tokens, all argmax


def metric_name(label: str, metric: str) -> str:
    """The name an entry's metric is logged under (OLMo's `eval/{label}/{metric}`), e.g.
    `metric_name("niah_single_1", "exact_match")`: a reader of the logs looks its entries up by label."""
    return f"eval/{label}/{metric}"


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


class _Batches(Dataset):
    """This rank's batches: global batch k of `batch_size` rows runs on rank k % world_size."""

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
        ids = [j if j < len(self.rows) else -1 for j in range(first, first + self.batch_size)]
        input_ids = torch.full((self.batch_size, self.length), self.pad, dtype=torch.long)  # [B, L]
        scored = torch.zeros((self.batch_size, self.length), dtype=torch.bool)  # [B, L]
        for b, j in enumerate(ids):
            row = self.rows[max(j, 0)]  # a padding row repeats row 0 with weight zero
            input_ids[b, : len(row.tokens)] = torch.tensor(row.tokens)
            scored[b, row.scored] = True
        return {"input_ids": input_ids, "niah_row": torch.tensor(ids), "niah_scored": scored}


@dataclass
class NiahEvaluator(Evaluator):
    """OLMo's `Evaluator` with NIAH's metrics under OLMo's names: `eval/{label}/{metric}`."""

    def update_metrics(self, batch: dict[str, Any], ce_loss: Tensor, logits: Tensor) -> None:
        assert isinstance(self.eval_metric, NiahMetric)
        self.eval_metric.update(batch, logits)

    def compute_metrics(self) -> dict[str, float]:
        assert isinstance(self.eval_metric, NiahMetric)
        return {metric_name(self.label, k): v.item() for k, v in self.eval_metric.compute().items()}


def _key(train_config: TrainConfig, eval_config: EvaluatorConfig) -> str:
    index = next(i for i, e in enumerate(train_config.evaluators) if e is eval_config)
    return f"evaluators[{index}]"


def build_niah_evaluator(
    train_config: TrainConfig,
    eval_config: EvaluatorConfig,
    tokenizer: Tokenizer,
    device: torch.device,
    prompts: int = PROMPTS,
) -> NiahEvaluator:
    """The evaluator of one `niah_*` entry; its prompts are built here. Raises `OLMoConfigurationError`, one
    line naming the key, for an unknown variant, a length past `model.max_sequence_length`, a tokenizer that
    cannot fit the prompts, and keys that do not apply."""
    from transformers import PreTrainedTokenizerFast

    from .niah import VARIANTS

    key, label = _key(train_config, eval_config), eval_config.label
    variant, _, length_text = label.partition("@")
    max_len = train_config.model.max_sequence_length
    if eval_config.type != EvaluatorType.downstream:
        raise OLMoConfigurationError(f"{key}.type: NIAH evaluator {label!r} is type: downstream")
    if variant not in VARIANTS:
        raise OLMoConfigurationError(
            f"{key}.label: unknown NIAH variant {variant!r}; allowed: {', '.join(VARIANTS)}, each optionally "
            "followed by @LENGTH"
        )
    if length_text and not (length_text.isdigit() and int(length_text) > 0):
        raise OLMoConfigurationError(f"{key}.label: {label!r}: the length after @ must be a positive integer")
    length = int(length_text) if length_text else max_len
    if length > max_len:
        raise OLMoConfigurationError(
            f"{key}.label: {label!r} asks for {length} tokens, past model.max_sequence_length ({max_len})"
        )
    if (configured := getattr(eval_config, "prompts", None)) is not None:  # RepoEvaluatorConfig.prompts
        prompts = configured
    if prompts < 1:
        raise OLMoConfigurationError(f"{key}.prompts={prompts}: a NIAH evaluator needs at least one prompt")
    if eval_config.subset_num_batches is not None:
        raise OLMoConfigurationError(
            f"{key}.subset_num_batches: NIAH evaluator {label!r} reads all its {prompts} prompts; set "
            f"{key}.prompts instead"
        )
    seed = eval_config.data.seed if eval_config.data.seed is not None else RULER_SEED
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.base_tokenizer)
    try:
        rows = niah_rows(hf, variant, length, prompts, seed)
    except ValueError as e:
        raise OLMoConfigurationError(
            f"{key}.label: {label!r} with tokenizer.identifier {train_config.tokenizer.identifier}: {e}"
        ) from None
    batch_size = eval_config.device_eval_batch_size or train_config.device_train_microbatch_size
    batches = _Batches(rows, batch_size, length, tokenizer.pad_token_id, get_global_rank(), get_world_size())
    return NiahEvaluator(
        label=label,
        type=eval_config.type,
        eval_loader=DataLoader(batches, batch_size=None),
        eval_metric=NiahMetric(rows).to(device),
        subset_num_batches=len(batches),  # all of them, whatever eval_subset_num_batches says
    )


def build_evaluator(
    train_config: TrainConfig,
    eval_config: EvaluatorConfig,
    tokenizer: Tokenizer,
    device: torch.device,
    prompts: int = PROMPTS,
) -> Evaluator:
    """OLMo's `build_evaluator` with `niah_*` labels built here (see `install`)."""
    if eval_config.label.startswith(PREFIX):
        return build_niah_evaluator(train_config, eval_config, tokenizer, device, prompts)
    if getattr(eval_config, "prompts", None) is not None:
        raise OLMoConfigurationError(
            f"{_key(train_config, eval_config)}.prompts: only NIAH evaluators (label: niah_*) take prompts"
        )
    return STOCK_EVALUATOR_BUILD(train_config, eval_config, tokenizer, device)


def install(prompts: int = PROMPTS) -> None:
    """Make OLMo's `build_evaluators` build a `NiahEvaluator` of `prompts` prompts for every `niah_*` entry
    (idempotent: a second call replaces the first)."""
    route_evaluator_build(partial(build_evaluator, prompts=prompts))
