"""In-loop RULER NIAH as an OLMo-core evaluator: the rows and metric of the ai2-olmo side (`olmo_repo.eval`'s
`inloop_rows`), the same metric names.

A config adds it like OLMo-core's own evaluator callbacks:

    trainer_config.with_callback("niah", NiahCallbackConfig(tokenizer=tokenizer_config, eval_interval=1000))

Every variant (default: all eight) is one `NiahEvaluator` of OLMo-core's `EvaluatorCallback`, which logs
`eval/{variant}/{metric}` (`@{length}` after the variant when `length` is not the training length):
`exact_match`, `logprob` and, for the variants with distractor values, `rank_acc`, as the ai2-olmo side logs them
(`olmo_repo.ai2olmo.niah` says what each scores). Prompts are RULER's (`niah_samples` with the run's tokenizer),
teacher-forced, padded to `length`; batch k of (at most) `batch_size` rows runs on rank k % world size and the
metric sums over ranks, so the result is one process's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from olmo_core.data import TokenizerConfig
from olmo_core.distributed.utils import get_rank, get_world_size
from olmo_core.eval import Evaluator
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.train.callbacks import CallbackConfig, EvaluatorCallback
from torch import Tensor

from ..eval.inloop_rows import PROMPTS, NiahMetric, RankBatches, niah_rows
from ..eval.variants import RULER_SEED

if TYPE_CHECKING:
    from olmo_core.train import Trainer

__all__ = ["NiahCallbackConfig", "NiahEvaluator"]


class NiahEvaluator(Evaluator):
    """One NIAH variant's rows, this rank's batches of them, and their metric."""

    def __init__(self, *, name: str, batches: RankBatches, metric: NiahMetric, device: torch.device) -> None:
        super().__init__(name=name, batches=batches, device=device)
        self.metric, self._batch = metric.to(device), {}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.batches)):
            self._batch = self.batches[i]  # input_ids [B, L], niah_row [B], niah_scored [B, L]
            yield {"input_ids": self._batch["input_ids"]}  # the model reads the tokens only

    @property
    def total_batches(self) -> int:
        return len(self.batches)

    def update_metrics(self, batch: dict[str, Any], ce_loss: Tensor | None, logits: Tensor | None) -> None:
        assert logits is not None
        self.metric.update({k: v.to(logits.device) for k, v in self._batch.items()}, logits)

    def compute_metrics(self) -> dict[str, Tensor]:
        return self.metric.compute()

    def reset_metrics(self) -> None:
        self.metric.reset()


def _hf_tokenizer(identifier: str | None) -> Any:
    from pathlib import Path

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if identifier is None:
        raise OLMoConfigurationError(
            "trainer.callbacks.niah.tokenizer.identifier is unset: NIAH needs the tokenizer"
        )
    if Path(identifier).is_file():
        return PreTrainedTokenizerFast(tokenizer_file=identifier)
    if identifier.endswith(".json") or Path(identifier).is_absolute():  # a file, not a Hub id
        raise OLMoConfigurationError(
            f"trainer.callbacks.niah.tokenizer.identifier={identifier} does not exist: in-loop NIAH builds its "
            "prompts with it"
        )
    return AutoTokenizer.from_pretrained(identifier)


@dataclass
class NiahCallbackConfig(CallbackConfig):
    """In-loop RULER NIAH (`olmo_repo.olmocore.niah`) as an OLMo-core `EvaluatorCallback`."""

    tokenizer: TokenizerConfig
    """The run's tokenizer (its identifier: a tokenizer.json path or a Hub id), as OLMo-core's downstream
    evaluator callback takes it."""
    variants: list[str] | None = None
    """RULER variants (`olmo_repo.eval.niah.VARIANTS`); None: all eight."""
    length: int | None = None
    """Prompt length in tokens; None: the train module's max_sequence_length."""
    prompts: int = PROMPTS
    """Prompts per variant."""
    seed: int = RULER_SEED
    """RULER's seed, as scripts/eval.py."""
    batch_size: int | None = None
    """Rows per forward on a rank; None: the train module's rank_microbatch_size // length."""
    eval_interval: int = 1000
    eval_on_startup: bool = False
    enabled: bool = True

    def check(self, max_len: int) -> int:
        """The prompt length, after the checks that need no prompt (`check_experiment` runs them before any
        worker starts); `OLMoConfigurationError` naming the key."""
        from ..eval.niah import VARIANTS

        length = self.length or max_len
        if length > max_len:
            raise OLMoConfigurationError(
                f"trainer.callbacks.niah.length={length} is past train_module.max_sequence_length ({max_len})"
            )
        if unknown := [v for v in self.variants or () if v not in VARIANTS]:
            raise OLMoConfigurationError(
                f"trainer.callbacks.niah.variants: unknown {unknown}; allowed: {', '.join(VARIANTS)}"
            )
        if self.prompts < 1:
            raise OLMoConfigurationError(f"trainer.callbacks.niah.prompts={self.prompts}: at least one")
        return length

    def check_prompts_fit(self, max_len: int) -> None:
        """`check`, then each variant's first prompt built with the tokenizer: a length too short for a variant's
        haystack is refused before any worker starts, in the words `build` would use (each worker builds every
        prompt; this builds one per variant)."""
        from ..eval.niah import VARIANTS

        length = self.check(max_len)
        hf = _hf_tokenizer(self.tokenizer.identifier)
        for variant in self.variants or list(VARIANTS):
            self._rows(hf, variant, length, 1)

    def _rows(self, hf: Any, variant: str, length: int, prompts: int) -> list:
        try:
            return niah_rows(hf, variant, length, prompts, self.seed)
        except ValueError as e:
            raise OLMoConfigurationError(
                f"trainer.callbacks.niah: {variant} at {length} tokens: {e}"
            ) from None

    def build(self, trainer: Trainer) -> EvaluatorCallback | None:
        if not self.enabled:
            return None
        from ..eval.niah import VARIANTS

        max_len = trainer.train_module.max_sequence_length
        length = self.check(max_len)
        hf = _hf_tokenizer(self.tokenizer.identifier)
        batch_size = self.batch_size or max(1, trainer.train_module.rank_microbatch_size // length)
        rank, world = get_rank(trainer.dp_process_group), get_world_size(trainer.dp_process_group)
        evaluators = []
        for variant in self.variants or list(VARIANTS):
            rows = self._rows(hf, variant, length, self.prompts)
            name = variant if length == max_len else f"{variant}@{length}"
            batches = RankBatches(rows, batch_size, length, self.tokenizer.pad_token_id, rank, world)
            evaluators.append(
                NiahEvaluator(name=name, batches=batches, metric=NiahMetric(rows), device=trainer.device)
            )
        return EvaluatorCallback(
            evaluators=evaluators, eval_interval=self.eval_interval, eval_on_startup=self.eval_on_startup
        )
