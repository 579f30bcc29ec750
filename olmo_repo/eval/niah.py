"""RULER needle-in-a-haystack (NIAH): the eight variants the paper reports, offline, run through lm-eval.

Writing and scoring a sample is lm-eval's RULER code (`lm_eval.tasks.ruler`):
`prepare_niah.generate_input_output` (needle and question templates; repeated-noise, essay and
distractor-needle haystacks; word / 7-digit number / UUID keys and values; depth placement) and
`common_utils.postprocess_pred` + `string_match_all` (the fraction of gold values found in the output,
case-insensitive). Deltas from lm-eval's `niah_*` tasks:

- Offline haystack by default (`essays="offline"`, see `olmo_repo.eval.essays`); `essays="paul_graham"` takes
  lm-eval's download of Paul Graham's essays (needs a network).
- Sizing: lm-eval's `generate_samples` grows the haystack in steps of 500 words or 25 sentences, so its
  prompts land up to hundreds of tokens short of the target. Here each sample's haystack is the largest, to
  one word (essays) or one sentence (repeat / needle haystacks), whose prompt plus RULER's 128 generated
  tokens fits `length` in the model's own tokens. The prompt is measured as the model reads it: RULER's
  input, a space and the answer prefix, without special tokens (lm-eval's HF backend adds none).
- Seeds: sample i of (variant, length) draws from its own generator, seeded from (seed, variant, length, i):
  the same seed gives the same prompts on every run, whatever the sample count. The caller's `random` state
  is left as it was.
- Any sample count (lm-eval: always RULER's `RULER_SAMPLES`).

API (the analysis code builds on it):

    from olmo_repo.eval import niah
    samples = niah.niah_samples(tokenizer, "niah_multikey_1", 4096, n=20)   # list[NiahSample], RULER_SEED
    s = samples[0]
    s.prompt                       # exactly what the model reads
    s.answers                      # gold values
    s.prompt[slice(*s.needle_spans[0])]   # a needle that holds a gold value (character span)
    s.prompt[slice(*s.query_span)]        # the question; s.context_span: the haystack with its needles
    scores, records = niah.evaluate(model, tokenizer, [1024, 4096], samples=20)  # {variant: {length: score}}
    niah.markdown_table(scores)   # one row per variant, one column per length, and the average row

Scores are fractions in [0, 1]; the table prints percent, like the paper.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import nltk
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .. import tables
from ..upstream.lm_eval import (
    TEMPLATE,
    maybe_delimit,
    metadata_tokenizer,
    prepare_niah,
    ruler_score,
    seeded_random,
    without_environment_report,
)
from .essays import essay_words
from .intervals import wilson_interval
from .variants import ESSAYS, MAX_NEW_TOKENS, RULER_SAMPLES, RULER_SEED, VARIANTS, Variant

__all__ = [
    "ESSAYS",
    "MAX_NEW_TOKENS",
    "RULER_SAMPLES",
    "RULER_SEED",
    "TASKS_DIR",
    "VARIANTS",
    "NiahSample",
    "Variant",
    "evaluate",
    "lm_eval_dataset",
    "markdown_table",
    "niah_samples",
    "percent_cell",
    "score",
]

TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"


@dataclass(frozen=True)
class NiahSample:
    """One NIAH prompt. Spans are [start, end) character offsets into `prompt`."""

    variant: str
    length: int  # target: prompt tokens + MAX_NEW_TOKENS <= length
    index: int
    input: str  # RULER's input (instructions, haystack with needles, question)
    gen_prefix: (
        str  # RULER's answer prefix, e.g. "The special magic number for x mentioned in the provided text is"
    )
    prompt: str  # what the model reads: input, a space, gen_prefix
    prompt_tokens: int
    answers: list[str]
    query: str  # the key(s) asked for, as written in the question
    needle_spans: list[tuple[int, int]]  # the needle sentences that hold the answers, in answer order
    query_span: tuple[int, int]  # the question line
    context_span: tuple[int, int]  # the haystack with every needle

    def doc(self) -> dict[str, Any]:
        """The sample as a RULER document of lm-eval (`input`, `outputs`, `gen_prefix`, `max_length`, ...)."""
        return {
            "index": self.index,
            "input": self.input,
            "outputs": self.answers,
            "length": self.prompt_tokens + MAX_NEW_TOKENS,
            "max_length": self.length,
            "gen_prefix": self.gen_prefix,
        }


def _haystack(kind: str, essays: str) -> str | list[str]:
    if essays not in ESSAYS:
        raise ValueError(f"essays={essays!r} is not supported; allowed: {', '.join(ESSAYS)}")
    if kind != "essay":
        return prepare_niah.get_haystack(type_haystack=kind)  # repeat / needle: built in, no download
    if essays == "offline":
        return list(essay_words())
    # RULER's essays are split into sentences with the real Punkt data (it precedes the offline stand-in).
    if not nltk.download("punkt_tab", quiet=True):
        raise ValueError("essays='paul_graham' needs a network: nltk's punkt_tab could not be downloaded")
    try:
        return prepare_niah.get_haystack(type_haystack="essay")
    except Exception as e:  # any failure of the download: say what was being fetched
        raise ValueError(f"essays='paul_graham': RULER's essays could not be downloaded ({e})") from None


def _gen_prefix(spec: Variant, query: str) -> str:
    # The answer prefix lm-eval's `generate_samples` writes into each document.
    if spec.num_queries * spec.num_values == 1:
        return f"The special magic {spec.value[:-1]} for {query} mentioned in the provided text is"
    return f"The special magic {spec.value} for {query} mentioned in the provided text are"


def _spans(spec: Variant, text: str, prompt: str, answers: list[str], query: str) -> dict[str, Any]:
    keys = query.rsplit(", and ", 1)
    keys = [*keys[0].split(", "), keys[1]] if len(keys) == 2 else keys
    needle_spans = []
    for i, key in enumerate(keys):
        for value in answers[i * spec.num_values : (i + 1) * spec.num_values]:
            needle = prepare_niah.NEEDLE.format(type_needle_v=spec.value, key=key, value=value)
            start = prompt.find(needle)
            if start < 0 or prompt.find(needle, start + 1) >= 0:
                raise RuntimeError(f"needle {needle!r} is not exactly once in the prompt")
            needle_spans.append((start, start + len(needle)))
    return dict(
        needle_spans=needle_spans,
        query_span=(text.rindex("\n") + 1, len(text)),
        context_span=(text.index("\n") + 1, text.rindex("\n")),
    )


def _largest(fits: Callable[[int], bool], lo: int, hi: int, start: int) -> int:
    """The largest n in [lo, hi] with fits(n) (fits(lo) is true; fits is non-increasing), searched from start."""
    start = min(max(start, lo), hi)
    if fits(start):
        good, bad, step = start, hi + 1, 1
        while good < hi:
            probe = min(good + step, hi)
            if not fits(probe):
                bad = probe
                break
            good, step = probe, 2 * step
    else:
        good, bad, step = lo, start, 1
        while bad - step > lo:
            if fits(bad - step):
                good = bad - step
                break
            bad, step = bad - step, 2 * step
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


class _Draft(NamedTuple):
    """lm-eval's sample for one haystack size, with the prompt as the model reads it."""

    text: str  # RULER's input
    answers: list[str]
    query: str
    prompt: str
    tokens: int  # of `prompt`, without special tokens


def niah_samples(
    tokenizer: PreTrainedTokenizerBase,
    variant: str,
    length: int,
    n: int,
    seed: int = RULER_SEED,
    essays: str = "offline",
) -> list[NiahSample]:
    """`n` prompts of `variant` for a `length`-token context with `tokenizer` (see the module docstring).

    Raises ValueError naming the variant and length when even the smallest haystack does not fit, or when the
    essay haystack is too short to fill `length`.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown NIAH variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    spec = VARIANTS[variant]
    haystack = _haystack(spec.haystack, essays)
    budget = length - MAX_NEW_TOKENS
    hi = len(haystack) if spec.haystack == "essay" else max(budget, spec.needles)  # a unit is >= 1 token
    samples, units = [], spec.needles
    for index in range(n):
        state = random.Random(f"niah/{seed}/{variant}/{length}/{index}").getstate()
        drafts: dict[int, _Draft] = {}

        def draft(units: int, state=state, drafts=drafts) -> _Draft:
            if units not in drafts:
                with seeded_random(state):  # lm-eval draws keys, values and depths from `random`
                    text, answers, query = prepare_niah.generate_input_output(
                        units,
                        haystack,
                        type_haystack=spec.haystack,
                        num_needle_k=max(spec.num_keys, spec.num_queries),
                        type_needle_k=spec.key,
                        num_needle_v=spec.num_values,
                        type_needle_v=spec.value,
                        template=TEMPLATE,
                        num_needle_q=spec.num_queries,
                        random_seed=seed,
                    )
                prompt = maybe_delimit(text, _gen_prefix(spec, query))
                tokens = len(tokenizer(prompt, add_special_tokens=False).input_ids)
                drafts[units] = _Draft(text, list(answers), query, prompt, tokens)
            return drafts[units]

        if (smallest := draft(spec.needles).tokens) > budget:
            raise ValueError(
                f"{variant}: length {length} is too short; the shortest it can build is about "
                f"{smallest + MAX_NEW_TOKENS} tokens (the prompt with the smallest haystack takes {smallest}, "
                f"plus {MAX_NEW_TOKENS} to generate)"
            )
        units = _largest(lambda u, draft=draft: draft(u).tokens <= budget, spec.needles, hi, units)
        chosen = draft(units)
        if spec.haystack == "essay" and units == hi:
            raise ValueError(
                f"{variant}: length {length} is beyond the essay haystack ({hi} words fill "
                f"{chosen.tokens} of {budget} prompt tokens)"
            )
        samples.append(
            NiahSample(
                variant=variant,
                length=length,
                index=index,
                input=chosen.text,
                gen_prefix=_gen_prefix(spec, chosen.query),
                prompt=chosen.prompt,
                prompt_tokens=chosen.tokens,
                answers=chosen.answers,
                query=chosen.query,
                **_spans(spec, chosen.text, chosen.prompt, chosen.answers, chosen.query),
            )
        )
    return samples


def score(prediction: str, answers: Sequence[str]) -> float:
    """RULER's recall for one sample: the fraction of `answers` found in `prediction` (case-insensitive)."""
    return ruler_score(prediction, list(answers))


# ----------------------------------------------------------------------------------------------- lm-eval


def lm_eval_dataset(variant: str, **metadata: Any) -> datasets.DatasetDict:
    """lm-eval `custom_dataset` of the `repo_niah_*` tasks: RULER documents for every length in
    `max_seq_lengths`, from the metadata lm-eval passes (`tokenizer` or `pretrained`: a tokenizer name or
    directory; `num_samples` (default `RULER_SAMPLES`), `seed` (`RULER_SEED`), `essays` ("offline"))."""
    tokenizer = metadata_tokenizer(metadata)
    docs = [
        sample.doc()
        for length in metadata.get("max_seq_lengths", [4096])
        for sample in niah_samples(
            tokenizer,
            variant,
            int(length),
            int(metadata.get("num_samples", RULER_SAMPLES)),
            int(metadata.get("seed", RULER_SEED)),
            metadata.get("essays", "offline"),
        )
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lengths: int | Sequence[int],
    *,
    variants: Iterable[str] = tuple(VARIANTS),
    samples: int = RULER_SAMPLES,
    seed: int = RULER_SEED,
    batch_size: int = 8,
    essays: str = "offline",
) -> tuple[dict[str, dict[int, float]], list[dict[str, Any]]]:
    """Run the `repo_niah_*` lm-eval tasks on a loaded HF model at one or more lengths: greedy, 128 new tokens,
    lm-eval's HF backend with `max_length` the largest length. The model runs as loaded (YaRN, if any, is set
    when loading it: `olmo_repo.eval.loading.load_model`). `tokenizer.name_or_path` must load the same tokenizer
    (lm-eval's RULER code loads it by name).

    Returns ({variant: {length: score in [0, 1]}}, one record per sample: variant, length, index, answers,
    output, score).
    """
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lengths = [lengths] if isinstance(lengths, int) else list(lengths)
    variants = list(variants)
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise ValueError(f"unknown NIAH variants {unknown}; allowed: {', '.join(VARIANTS)}")
    if not tokenizer.name_or_path:
        raise ValueError("the tokenizer has no name_or_path: load it with AutoTokenizer.from_pretrained")
    metadata = dict(
        max_seq_lengths=lengths,
        num_samples=samples,
        seed=seed,
        essays=essays,
        tokenizer=tokenizer.name_or_path,
    )
    if isinstance(model, LM):  # already an lm-eval model (--backend vllm)
        lm = model
    else:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max(lengths))
    with without_environment_report():
        out = simple_evaluate(
            model=lm,
            tasks=[f"repo_{v}" for v in variants],
            task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata),
            log_samples=True,
        )
    records = [
        {
            "variant": v,
            "length": s["doc"]["max_length"],
            "index": s["doc"]["index"],
            "answers": s["doc"]["outputs"],
            "output": s["resps"][0][0],
            "score": s["score"],
        }
        for v in variants
        for s in sorted(
            out["samples"][f"repo_{v}"], key=lambda s: (s["doc"]["max_length"], s["doc"]["index"])
        )
    ]
    scores = {
        v: {
            length: sum(mine) / len(mine)
            for length in lengths
            if (mine := [r["score"] for r in records if r["variant"] == v and r["length"] == length])
        }
        for v in variants
    }
    return scores, records


def markdown_table(scores: Mapping[str, Mapping[int, float]], samples: int | None = None) -> str:
    """{variant: {length: score in [0, 1]}} -> a markdown table in percent: one row per variant, one column per
    length, and the average over the variants (the paper's NIAH number). With `samples` (per cell), each cell
    also gives its 95% interval (`olmo_repo.eval.intervals`; the average's over the samples of its column)."""
    lengths = sorted({length for row in scores.values() for length in row})
    rows = [
        [variant, *(percent_cell(row.get(length), samples) for length in lengths)]
        for variant, row in scores.items()
    ]
    averages = [[row[length] for row in scores.values() if length in row] for length in lengths]
    rows.append(
        ["**average**", *(percent_cell(sum(a) / len(a), samples and samples * len(a)) for a in averages)]
    )
    table = tables.markdown_table(["variant", *map(str, lengths)], rows) + "\n"
    if samples:
        table += f"\n{samples} sample{'s' * (samples != 1)} per cell; in brackets the 95% interval (Wilson) of each score.\n"
    return table


def percent_cell(value: float | None, samples: int | None = None) -> str:
    """A score in [0, 1] as a table cell in percent, with its 95% interval (Wilson) over `samples` if given."""
    if value is None:
        return ""
    if not samples:
        return f"{100 * value:.1f}"
    low, high = wilson_interval(value, samples)
    return f"{100 * value:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
