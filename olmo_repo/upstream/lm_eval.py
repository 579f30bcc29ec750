"""lm-eval 0.4.13: RULER's NIAH generator and scorer, the task YAML loader, and its log level.

What lm-eval lacks as public API, and so is taken from its internals here:

- RULER's generator (`lm_eval.tasks.ruler.prepare_niah`: `generate_input_output`, `get_haystack`, the word
  lists `adjs`/`nouns`, `NEEDLE`; `niah_utils.TEMPLATE`) and scorer (`common_utils.postprocess_pred`,
  `string_match_all`), and the tokenizer its task metadata names (`get_tokenizer`, `resolve_tokenizer_name`).
  The module downloads Punkt's data when imported: `upstream.nltk` points nltk at an offline copy first.
- The same module computes `WORDS` when imported (every "adjective-noun" key, `sorted(set(...))`: 6.2M
  strings, ~10 s and ~1 GB in every process, also those that never draw a word key). It is imported here
  without that (`_import_prepare_niah`) and given `AdjectiveNounKeys` instead: the same list, indexed
  without building it. The canary compares the two lists and pins the lines this relies on.
- The generator draws keys, values and depths from the global `random` module: `seeded_random(state)` runs
  it from a given state and gives the caller's state back.
- `load_yaml` of the private `lm_eval.tasks._yaml_loader` reads a task YAML without resolving its `!function`s.
- `quiet()`: lm-eval logs a note per task and per request batch at INFO; reports set it to ERROR.
- `without_environment_report()`: `simple_evaluate` ends by adding torch's environment report (`collect_env`:
  `pip list`, compiler and driver versions; ~0.8 CPU-s and 1-2 s of subprocesses per call) to results that
  nothing here reads. Inside the block it calls `lm_eval.evaluator.add_env_info` (a module global, which
  the canary on `simple_evaluate` pins) as a no-op.
- RULER's other generators (`ruler_module("vt" | "cwe" | "fwe" | "qa")`: `vt_utils`, `cwe_utils`, `fwe_utils`,
  `qa_utils`), whose `sys_*` / `generate_samples` take a sample count that lm-eval's tasks fix at 500, and
  whose vt and cwe searches loop forever below their smallest prompt: `olmo_repo.eval.ruler` calls them with
  `num_samples` and only at lengths it has checked. `CANARIES` pins what it relies on (loops, sizes, fields).
"""

from __future__ import annotations

import logging
import random
import sys
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from importlib import import_module
from types import ModuleType
from typing import Any

from .nltk import use_offline_punkt

use_offline_punkt()  # before RULER's module is imported: it downloads `punkt_tab` when it finds none

from lm_eval.api.utils import maybe_delimit  # noqa: E402
from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402
from lm_eval.tasks.ruler.common_utils import (  # noqa: E402
    get_tokenizer,
    postprocess_pred,
    resolve_tokenizer_name,
    string_match_all,
)


class AdjectiveNounKeys(Sequence[str]):
    """RULER's `WORDS`: every "adjective-noun" string, sorted, without duplicates, indexed without building the
    6.2M strings. With H = "adjective-", the words of two heads that are not prefixes of one another do not
    interleave (they differ within both heads), so the list is one block per head, its words H + each noun in
    noun order. Only a head with longer heads starting with it ("well-", "well-known-") shares a block with
    them, built as RULER builds it (sorted, duplicates dropped: "well-" + "known-x" is "well-known-" + "x")."""

    def __init__(self, adjectives: list[str], nouns: list[str]):
        self.adjectives, self.nouns = adjectives, nouns

    @cached_property
    def _blocks(self) -> tuple[list[int], list[str | list[str]], list[str]]:
        """(first index of each block, the blocks: a head or a group's sorted words, the sorted nouns)."""
        nouns = sorted(set(self.nouns))
        heads = sorted({f"{a}-" for a in self.adjectives})
        starts, blocks, total, i = [], [], 0, 0
        while i < len(heads):
            j = i + 1
            while j < len(heads) and heads[j].startswith(heads[i]):
                j += 1
            block: str | list[str] = (
                heads[i] if j == i + 1 else sorted({h + n for h in heads[i:j] for n in nouns})
            )
            starts.append(total)
            blocks.append(block)
            total += len(nouns) if isinstance(block, str) else len(block)
            i = j
        starts.append(total)
        return starts, blocks, nouns

    def __len__(self) -> int:
        return self._blocks[0][-1]

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  (no slices: random.choice indexes)
        starts, blocks, nouns = self._blocks
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"word index {i} out of range")
        k = bisect_right(starts, i) - 1
        block = blocks[k]
        return block + nouns[i - starts[k]] if isinstance(block, str) else block[i - starts[k]]

    def __iter__(self) -> Iterator[str]:
        _, blocks, nouns = self._blocks
        for block in blocks:
            yield from ([block + n for n in nouns] if isinstance(block, str) else block)


def _import_prepare_niah() -> ModuleType:
    """`lm_eval.tasks.ruler.prepare_niah`, its `WORDS` an `AdjectiveNounKeys`: while the module runs, the
    `RandomWord` it builds its lists from lists no noun (so its `words` and `WORDS` are empty), then the module
    gets the nouns back and the lazy `WORDS`. Already imported (by lm-eval's own task loading), it is left as
    it is: its `WORDS` is the same list."""
    import wonderwords

    if "lm_eval.tasks.ruler.prepare_niah" in sys.modules:
        return sys.modules["lm_eval.tasks.ruler.prepare_niah"]
    import datasets  # noqa: F401  (what the module imports, imported outside the window below)
    import nltk  # noqa: F401
    import tqdm  # noqa: F401

    stock = wonderwords.RandomWord

    class NoNouns(stock):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.nouns = self._categories["nouns"]
            self._categories = {**self._categories, "nouns": []}

    wonderwords.RandomWord = NoNouns
    try:
        module = import_module("lm_eval.tasks.ruler.prepare_niah")
    finally:
        wonderwords.RandomWord = stock
    module.nouns = module.r.nouns
    module.r._categories = {**module.r._categories, "nouns": module.nouns}
    module.WORDS = AdjectiveNounKeys(module.adjs, module.nouns)
    return module


prepare_niah = _import_prepare_niah()

from lm_eval.tasks.ruler.niah_utils import TEMPLATE  # noqa: E402

__all__ = [
    "CANARIES",
    "AdjectiveNounKeys",
    "TEMPLATE",
    "load_yaml",
    "maybe_delimit",
    "metadata_tokenizer",
    "prepare_niah",
    "quiet",
    "ruler_module",
    "ruler_score",
    "ruler_score_part",
    "seeded_random",
    "without_environment_report",
]


@contextmanager
def seeded_random(state: tuple[Any, ...]) -> Iterator[None]:
    """Run the block with the global `random` state set to `state`; restore the caller's state after."""
    caller = random.getstate()
    random.setstate(state)
    try:
        yield
    finally:
        random.setstate(caller)


def ruler_score(prediction: str, answers: list[str]) -> float:
    """RULER's recall for one sample: the fraction of `answers` found in `prediction` (case-insensitive)."""
    return string_match_all(postprocess_pred([prediction]), [answers])


def metadata_tokenizer(metadata: dict[str, Any]) -> Any:
    """The tokenizer a RULER task's metadata names (`tokenizer` or `pretrained`), as lm-eval loads it."""
    return get_tokenizer(resolve_tokenizer_name(metadata))


def quiet() -> None:
    """lm-eval's loggers at ERROR: its per-task and per-batch INFO notes drown a report."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)


@contextmanager
def without_environment_report() -> Iterator[None]:
    """Run the block with `simple_evaluate`'s environment report skipped (see the module's docstring)."""
    import lm_eval.evaluator as evaluator

    add_env_info = evaluator.add_env_info
    evaluator.add_env_info = lambda storage: None
    try:
        yield
    finally:
        evaluator.add_env_info = add_env_info


_RULER = "lm_eval.tasks.ruler"
# Source hashes (`olmo_repo.upstream.source_hash`) of the RULER generators `olmo_repo.eval.ruler` calls: their
# sizing loops (where they stop, and where they loop forever) are what its minimum lengths are computed from.
CANARIES = {
    # the whole module: what it computes at import (`_import_prepare_niah`) and the generator the project calls
    f"{_RULER}.prepare_niah": "beb37d90132ce928",
    f"{_RULER}.vt_utils.generate_input_output": "0be252b7968b7401",
    f"{_RULER}.vt_utils.sys_vartrack_w_noise_random": "ec63591efdaa48dd",
    f"{_RULER}.cwe_utils.generate_input_output": "3e9b4261e6ea46a8",
    f"{_RULER}.cwe_utils.sys_word_pair_random": "862851d83a700801",
    f"{_RULER}.cwe_utils.get_example": "e1a172cb4452a8c7",
    f"{_RULER}.cwe_utils.RNG": None,  # the module's generator: seeded by olmo_repo.eval.ruler
    f"{_RULER}.fwe_utils.generate_input_output": "309aa64e1932883a",
    f"{_RULER}.fwe_utils.sys_kwext": "fb94f200d8c23f27",
    f"{_RULER}.qa_utils.generate_samples": "68b35827e50f4517",
    f"{_RULER}.qa_utils.read_squad": "6102836c0937c400",
    f"{_RULER}.qa_utils.read_hotpotqa": "faa7c679008cecc0",
    f"{_RULER}.common_utils.string_match_part": "7ea977fc810af43e",
    "lm_eval.evaluator.simple_evaluate": "9eecb3c9d0d9660c",  # calls `add_env_info` by its module global
}


def ruler_module(name: str) -> ModuleType:
    """RULER's `{name}_utils` module of lm-eval (vt, cwe, fwe, qa), imported on first use (cwe reads
    wonderwords' word lists, fwe imports scipy)."""
    return import_module(f"{_RULER}.{name}_utils")


def ruler_score_part(prediction: str, answers: list[str]) -> float:
    """RULER's QA score for one sample: 1 if any of `answers` is in `prediction` (case-insensitive)."""
    from lm_eval.tasks.ruler.common_utils import string_match_part

    return string_match_part(postprocess_pred([prediction]), [answers])
