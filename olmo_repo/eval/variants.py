"""The RULER NIAH variants and the evaluation's constants, with no heavy import: `scripts/eval.py` builds its
parser (and answers `--help` and argument errors) from them before torch, transformers or lm-eval load.
`olmo_repo.eval.niah` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ESSAYS",
    "MAX_NEW_TOKENS",
    "NIAH_LENGTHS",
    "PROMPTS",
    "RULER_SAMPLES",
    "RULER_SEED",
    "SUITE_LENGTHS",
    "VARIANTS",
    "Variant",
    "parse_lengths",
    "parse_tasks",
    "parse_yarn",
]

MAX_NEW_TOKENS = 128  # RULER's tokens_to_generate: part of the target length
RULER_SEED = 42  # RULER's seed: the default of every prompt this package builds (NIAH, RULER, in-loop NIAH)
RULER_SAMPLES = 500  # RULER's samples per task and length: the default sample count
ESSAYS = ("offline", "paul_graham")
NIAH_LENGTHS = (4096,)  # `scripts/eval.py --tasks`' default: the paper's training length
PROMPTS = 100
"""In-loop NIAH prompts per variant (`olmo_repo.ai2olmo.niah`). All eight variants at the training length then
cost a small share of the training FLOPs between two calls of the official 1B config (README, "In-loop NIAH",
counts it)."""
SUITE_LENGTHS = (4096, 8192, 16384)  # `--suite`'s: the training length, then 2x and 4x with YaRN, the paper's


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


def parse_lengths(text: str) -> list[int]:
    """Comma-separated context lengths (the `--lengths` flag), each past the `MAX_NEW_TOKENS` generated;
    raises ValueError naming the flag."""
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lengths={text!r}: expected comma-separated integers such as 4096,8192") from None
    if not lengths or min(lengths) <= MAX_NEW_TOKENS:
        raise ValueError(
            f"--lengths={text!r}: every length must exceed the {MAX_NEW_TOKENS} generated tokens"
        )
    return lengths


def parse_tasks(text: str) -> list[str]:
    """`niah` (every variant) or comma-separated variants (the `--tasks` flag); raises ValueError naming it."""
    if text == "niah":
        return list(VARIANTS)
    variants = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if not variants or unknown:
        raise ValueError(
            f"--tasks={text!r}: unknown task(s) {', '.join(unknown)}; allowed: niah or any of {', '.join(VARIANTS)}"
        )
    return variants
