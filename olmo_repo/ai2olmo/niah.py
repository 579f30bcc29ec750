"""In-loop RULER NIAH: a retrieval evaluator that OLMo's Trainer runs every `eval_interval` steps.

A config names it like any other in-loop evaluator, one entry per variant (`olmo_repo.eval.niah.VARIANTS`):

    evaluators:
      - label: niah_multikey_1          # at the run's model.max_sequence_length
        type: downstream
      - label: niah_single_1@2048       # at 2048 tokens (at most model.max_sequence_length)
        type: downstream
        prompts: 20                     # default: PROMPTS

The prompts are `niah.niah_samples(tokenizer, variant, length, prompts, seed)` with the run's tokenizer; the
entry's `prompts` key (`olmo_repo.ai2olmo.config.RepoEvaluatorConfig`) sets their number (default `PROMPTS`), its
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
(default: the training micro-batch, since rows are as long as training instances; the last batch holds what is
left, not padding rows that would cost as much to read); batch k runs on rank k % world_size, the batch count
padded to a multiple of the world size with batches of one row of weight zero (FSDP needs the same number of
forwards on every rank). Each row's numbers land in its own slot of a [rows, 3] float64
state, zero on every other rank, which torchmetrics sums over ranks at `compute`: the result is that of one
process that reads the same batches.

`install()` routes OLMo's evaluator building (`olmo_repo.upstream.olmo.route_evaluator_build`) so that a
`type: downstream` entry whose label starts with `niah_` builds this evaluator; the train command calls it.
"""

from __future__ import annotations

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
from torch.utils.data import DataLoader

from ..eval.inloop_rows import PROMPTS, RANK_CANDIDATES, NiahMetric, niah_rows
from ..eval.inloop_rows import RankBatches as _Batches
from ..eval.variants import RULER_SEED
from ..metrics import metric_name
from ..upstream.olmo import STOCK_EVALUATOR_BUILD, route_evaluator_build

__all__ = [
    "PREFIX",
    "PROMPTS",
    "RANK_CANDIDATES",
    "NiahEntry",
    "NiahEvaluator",
    "NiahMetric",
    "build_evaluator",
    "check_entry",
    "check_prompts_fit",
    "install",
    "metric_name",
    "niah_rows",
]

PREFIX = "niah_"


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


def check_entry(train_config: TrainConfig, eval_config: EvaluatorConfig, prompts: int = PROMPTS) -> NiahEntry:
    """What a `niah_*` entry asks for, checked without building a prompt (`scripts/train.py --check` runs this
    for every entry before any worker starts). Raises `OLMoConfigurationError`, one line naming the key, for
    an unknown variant, a length past `model.max_sequence_length`, and keys that do not apply; an entry that is
    not NIAH (its label does not start with `niah_`) only may not take `prompts`."""
    from ..eval.niah import VARIANTS

    key, label = _key(train_config, eval_config), eval_config.label
    if not label.startswith(PREFIX):
        if getattr(eval_config, "prompts", None) is not None:
            raise OLMoConfigurationError(f"{key}.prompts: only NIAH evaluators (label: niah_*) take prompts")
        return NiahEntry("", 0, 0, 0)
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
    return NiahEntry(variant, length, prompts, seed)


@dataclass(frozen=True)
class NiahEntry:
    """A `niah_*` entry's variant, prompt length, prompt count and seed (`check_entry`)."""

    variant: str
    length: int
    prompts: int
    seed: int


def build_niah_evaluator(
    train_config: TrainConfig,
    eval_config: EvaluatorConfig,
    tokenizer: Tokenizer,
    device: torch.device,
    prompts: int = PROMPTS,
) -> NiahEvaluator:
    """The evaluator of one `niah_*` entry (`check_entry`); its prompts are built here. Raises
    `OLMoConfigurationError`, one line naming the key, for what `check_entry` refuses and a tokenizer that
    cannot fit the prompts."""
    from transformers import PreTrainedTokenizerFast

    entry = check_entry(train_config, eval_config, prompts)
    length = entry.length
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.base_tokenizer)
    rows = _rows(train_config, eval_config, hf, entry)
    batch_size = eval_config.device_eval_batch_size or train_config.device_train_microbatch_size
    batches = _Batches(rows, batch_size, length, tokenizer.pad_token_id, get_global_rank(), get_world_size())
    return NiahEvaluator(
        label=eval_config.label,
        type=eval_config.type,
        eval_loader=DataLoader(batches, batch_size=None),
        eval_metric=NiahMetric(rows).to(device),
        subset_num_batches=len(batches),  # all of them, whatever eval_subset_num_batches says
    )


def check_prompts_fit(train_config: TrainConfig, eval_config: EvaluatorConfig) -> None:
    """`check_entry`, then the entry's first prompt built with the run's tokenizer: a length too short for the
    variant's haystack is refused before any worker starts, in the words its evaluator's build would use (each
    worker builds every prompt; this builds one)."""
    from olmo.tokenizer import Tokenizer
    from transformers import PreTrainedTokenizerFast

    entry = check_entry(train_config, eval_config)
    if entry.variant:
        tokenizer = Tokenizer.from_train_config(train_config)
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.base_tokenizer)
        _rows(train_config, eval_config, hf, NiahEntry(entry.variant, entry.length, 1, entry.seed))


def _rows(train_config: TrainConfig, eval_config: EvaluatorConfig, hf: Any, entry: NiahEntry) -> list:
    """The entry's rows (`niah_rows`); `OLMoConfigurationError` naming the key where the prompts do not fit."""
    try:
        return niah_rows(hf, entry.variant, entry.length, entry.prompts, entry.seed)
    except ValueError as e:
        raise OLMoConfigurationError(
            f"{_key(train_config, eval_config)}.label: {eval_config.label!r} with tokenizer.identifier "
            f"{train_config.tokenizer.identifier}: {e}"
        ) from None


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
    check_entry(train_config, eval_config)  # `prompts` only on NIAH entries
    return STOCK_EVALUATOR_BUILD(train_config, eval_config, tokenizer, device)


def install(prompts: int = PROMPTS) -> None:
    """Make OLMo's `build_evaluators` build a `NiahEvaluator` of `prompts` prompts for every `niah_*` entry
    (idempotent: a second call replaces the first)."""
    route_evaluator_build(partial(build_evaluator, prompts=prompts))
