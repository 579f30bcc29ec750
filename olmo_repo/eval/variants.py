"""The RULER NIAH variants and the evaluation's constants, with no heavy import: `scripts/eval.py` builds its
parser (and answers `--help` and argument errors) from them before torch, transformers or lm-eval load.
`olmo_repo.eval.niah` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPE_NAMES", "ESSAYS", "MAX_NEW_TOKENS", "VARIANTS", "Variant", "parse_yarn"]

MAX_NEW_TOKENS = 128  # RULER's tokens_to_generate: part of the target length
ESSAYS = ("offline", "paul_graham")
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the keys of olmo_repo.hf.DTYPES, without importing torch


@dataclass(frozen=True)
class Variant:
    """One RULER NIAH setting: the keyword arguments lm-eval's `niah_utils` passes to `generate_samples`."""

    haystack: str  # repeat | essay | needle
    key: str  # words | numbers | uuids
    value: str
    num_keys: int = 1  # needles with distinct keys (the others are distractors)
    num_values: int = 1  # values per key
    num_queries: int = 1  # keys asked for

    @property
    def needles(self) -> int:
        return max(self.num_keys, self.num_queries) * self.num_values


VARIANTS: dict[str, Variant] = {
    "niah_single_1": Variant("repeat", "words", "numbers"),
    "niah_single_2": Variant("essay", "words", "numbers"),
    "niah_single_3": Variant("essay", "words", "uuids"),
    "niah_multikey_1": Variant("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": Variant("needle", "words", "numbers"),
    "niah_multikey_3": Variant("needle", "uuids", "uuids"),
    "niah_multivalue": Variant("essay", "words", "numbers", num_values=4),
    "niah_multiquery": Variant("essay", "words", "numbers", num_queries=4),
}


def parse_yarn(value: str) -> str | float:
    """`auto`, `off` or a factor > 1 (the `--yarn` flag); raises ValueError naming the flag."""
    if value in ("auto", "off"):
        return value
    try:
        factor = float(value)
    except ValueError:
        factor = 0.0
    if not factor > 1.0:
        raise ValueError(f"--yarn={value!r}: allowed auto, off or a factor > 1 (e.g. 2)")
    return factor
