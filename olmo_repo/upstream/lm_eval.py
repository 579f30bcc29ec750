"""lm-eval 0.4.13: RULER's NIAH generator and scorer, the task YAML loader, and its log level.

What lm-eval lacks as public API, and so is taken from its internals here:

- RULER's generator (`lm_eval.tasks.ruler.prepare_niah`: `generate_input_output`, `get_haystack`, the word
  lists `adjs`/`nouns`, `NEEDLE`; `niah_utils.TEMPLATE`) and scorer (`common_utils.postprocess_pred`,
  `string_match_all`), and the tokenizer its task metadata names (`get_tokenizer`, `resolve_tokenizer_name`).
  The module downloads Punkt's data when imported: `upstream.nltk` points nltk at an offline copy first.
- The generator draws keys, values and depths from the global `random` module: `seeded_random(state)` runs
  it from a given state and gives the caller's state back.
- `load_yaml` of the private `lm_eval.tasks._yaml_loader` reads a task YAML without resolving its `!function`s.
- `quiet()`: lm-eval logs a note per task and per request batch at INFO; reports set it to ERROR.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .nltk import use_offline_punkt

use_offline_punkt()  # before RULER's module is imported: it downloads `punkt_tab` when it finds none

from lm_eval.api.utils import maybe_delimit  # noqa: E402
from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402
from lm_eval.tasks.ruler import prepare_niah  # noqa: E402
from lm_eval.tasks.ruler.common_utils import (  # noqa: E402
    get_tokenizer,
    postprocess_pred,
    resolve_tokenizer_name,
    string_match_all,
)
from lm_eval.tasks.ruler.niah_utils import TEMPLATE  # noqa: E402

__all__ = [
    "TEMPLATE",
    "load_yaml",
    "maybe_delimit",
    "metadata_tokenizer",
    "prepare_niah",
    "quiet",
    "ruler_score",
    "seeded_random",
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
