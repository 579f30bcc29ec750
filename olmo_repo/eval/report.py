"""A Markdown report that compares HF models with the analyses of this package (`make demo` ends with one).

`write_report(report, models, ...)` evaluates every model and writes the Markdown file `report` (e.g.
`runs/demo/report.md`), its PNG figures in `figures/` beside it; `report_sections` yields the same sections one
by one, for a caller that records them (`make demo`):

- NIAH (RULER, `olmo_repo.eval.niah`) at the training length and at 2x and 4x with YaRN (factor 2 and 4,
  `olmo_repo.eval.loading`), per variant and averaged, with the score-against-length plot
- attention mass of the last prompt token on needle / query / other tokens of NIAH prompts at the training
  length (`olmo_repo.eval.attention`), per model
- for every model with RePo layers: chunk patterns, spread and order per layer (std, 5th-95th percentile, rank
  correlation with the token index, as the trainers log them), spans against context length and one head's
  positions (`olmo_repo.eval.positions`)
- with `replaced`, for every model with RePo layers: how much the learned positions matter, NIAH and attention
  mass with the RePo layers' positions replaced at evaluation by the token index (RoPE) and by one constant
  position (NoPE) beside the learned ones (`replacement_table`; `scripts/eval.py --positions`)
- training cost: parameters and 6 N D FLOPs of the models' configs for a token count (`olmo_repo.flops`)

Sections the caller measured itself (e.g. a training table) go in first through `preamble`. The report is
rewritten whole (`olmo_repo.output.write_file`) as each section is ready: an interrupted evaluation leaves the
sections before it, never a half-written file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache, partial
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers import AutoTokenizer

from .. import output
from ..hf.params import hf_parameter_count
from ..modes import PositionSource, repo_layer_ids
from ..tables import markdown_table
from . import niah, plots
from .analysis import NeedlePrompt, attention_section, positions_section
from .attention import attention_mass, attention_mass_table, mean_attention_mass
from .loading import load_model, read_config, training_length, yarn_factor
from .variants import RULER_SEED

__all__ = [
    "REPLACEMENT_NOTE",
    "niah_scores",
    "niah_section",
    "replacement_scores",
    "replacement_table",
    "report_sections",
    "write_report",
]

REPLACEMENT_NOTE = (
    "How much the learned positions matter: the same prompts scored with the RePo layers' positions replaced at "
    "evaluation by the token index (index: each RePo layer scores as the RoPE layer it replaced) and by one "
    "constant position (constant: as NoPE), f_phi unused (`scripts/eval.py --positions`); learned - index and "
    "learned - constant in points."
)
"""What a replacement table compares, for the text above it."""


def niah_scores(
    models: Mapping[str, Path],
    lengths: Sequence[int],
    variants: Sequence[str],
    samples: int,
    seed: int = RULER_SEED,
    positions: str = PositionSource.learned,
) -> dict[str, dict[str, dict[int, float]]]:
    """{model: {variant: {length: score}}}: each model loaded for each length (YaRN past its training length),
    its RePo layers rotating by `positions` (`loading.position_overrides`)."""
    runs = [(name, length) for name in models for length in lengths]
    out: dict[str, dict[str, dict[int, float]]] = {name: {v: {} for v in variants} for name in models}
    desc = "NIAH" if positions == PositionSource.learned else f"NIAH, {positions} positions"
    for name, length in tqdm(runs, desc=desc, unit="run"):
        tokenizer = AutoTokenizer.from_pretrained(models[name])
        model = load_model(models[name], length, positions=positions)
        scores, _ = niah.evaluate(model, tokenizer, length, variants=variants, samples=samples, seed=seed)
        for variant, by_length in scores.items():
            out[name][variant].update(by_length)
    return out


def niah_section(
    scores: Mapping[str, Mapping[str, Mapping[int, float]]],
    training: int,
    figures: Path,
    groups: Mapping[str, Sequence[str]],
    samples: int | None = None,
) -> str:
    """The NIAH section of `niah_scores`' {model: {variant: {length: score}}}: per group of variants the
    average per model and length (percent) and its plot in `figures`, then each model's per-variant table
    (with `samples` per cell, each score's 95% interval)."""
    lengths = sorted({n for by_variant in scores.values() for row in by_variant.values() for n in row})
    header = [
        "model",
        *(f"{n}" + (f" (YaRN x{yarn_factor(n, training):g})" if n > training else "") for n in lengths),
    ]
    tables, figure_links = [], []
    for group, variants in groups.items():
        average = {
            name: {n: sum(by_variant[v][n] for v in variants) / len(variants) for n in lengths}
            for name, by_variant in scores.items()
        }
        rows = [
            [name, *(f"{100 * by_length[n]:.1f}" for n in lengths)] for name, by_length in average.items()
        ]
        named = f" ({group})" if len(groups) > 1 else ""
        figure = plots.plot_niah_accuracy(
            average,
            figures / f"niah{'-' + group.replace(' ', '-') if len(groups) > 1 else ''}.png",
            title=f"NIAH (RULER) against context length{named}",
        )
        tables.append(
            f"Average over {'the ' + group + ' variants ' if len(groups) > 1 else 'the variants '}"
            f"{', '.join(variants)}:\n\n{markdown_table(header, rows)}\n"
        )
        figure_links.append(f"![NIAH{named}]({figures.name}/{figure.name})")
    per_variant = "".join(
        f"\n<details><summary>{name}, per variant</summary>\n\n{niah.markdown_table(by_variant, samples)}\n"
        "</details>\n"
        for name, by_variant in scores.items()
    )
    return (
        f"Percent of gold values found in the greedy output (training length {training}).\n\n"
        + "\n".join(tables)
        + f"{per_variant}\n"
        + " ".join(figure_links)
        + "\n"
    )


def replacement_scores(
    model: Path,
    lengths: Sequence[int],
    variants: Sequence[str],
    samples: int,
    seed: int = RULER_SEED,
) -> dict[str, dict[str, dict[int, float]]]:
    """{position source: {variant: {length: score}}} of the RePo model in `model` (an HF directory): NIAH with its
    RePo layers rotating by the learned positions, the token index and one constant position, the input of
    `replacement_table`."""
    return {
        str(source): niah_scores({"model": model}, lengths, variants, samples, seed, source)["model"]
        for source in PositionSource
    }


def replacement_table(
    scores: Mapping[str, Mapping[str, Mapping[int, float]]], samples: int | None = None
) -> str:
    """How much the learned positions matter, as a Markdown table (`REPLACEMENT_NOTE` says what it compares).

    `scores`: {position source (learned, index, constant: `modes.PositionSource`): {variant: {length: score in
    [0, 1]}}}, e.g. NIAH's (`replacement_scores`) or any per-variant score of the same prompts under each source.
    One row per variant and length, then the average over the variants per length: a column per source given (in
    percent; with `samples` per cell, its 95% interval, Wilson), and learned - index, learned - constant in points
    where both are given."""
    sources = [str(s) for s in PositionSource if str(s) in scores]
    if not sources:
        raise ValueError(f"no scores of a position source ({', '.join(PositionSource.__members__)}) given")
    variants = list(dict.fromkeys(v for source in sources for v in scores[source]))
    lengths = sorted({n for source in sources for row in scores[source].values() for n in row})
    others = [s for s in sources if s != PositionSource.learned] if PositionSource.learned in sources else []
    rows = []
    for variant in [*variants, None]:  # None: the average over the variants
        for n in lengths:
            cells = {s: _score(scores[s], variant, n) for s in sources}
            count = samples and samples * (len(variants) if variant is None else 1)
            rows.append(
                [
                    variant or "**average**",
                    n,
                    *(niah.percent_cell(cells[s], count) for s in sources),
                    *(_points(cells[PositionSource.learned], cells[s]) for s in others),
                ]
            )
    header = ["variant", "length", *sources, *(f"learned - {s}" for s in others)]
    table = markdown_table(header, rows) + "\n"
    if samples:
        table += (
            f"\n{samples} sample{'s' * (samples != 1)} per cell; in brackets the 95% interval (Wilson).\n"
        )
    return table


def _score(by_variant: Mapping[str, Mapping[int, float]], variant: str | None, length: int) -> float | None:
    """A variant's score at `length`, or (variant None) the mean over the variants scored there."""
    if variant is not None:
        return by_variant.get(variant, {}).get(length)
    scored = [row[length] for row in by_variant.values() if length in row]
    return sum(scored) / len(scored) if scored else None


def _points(learned: float | None, other: float | None) -> str:
    return "" if learned is None or other is None else f"{100 * (learned - other):+.1f}"


def _flops_markdown(models: Mapping[str, Path], tokens: int) -> str:
    rows = []
    for name, hf_dir in models.items():
        count = hf_parameter_count(read_config(hf_dir))
        rows.append(
            [
                name,
                f"{count.total:,}",
                f"{count.non_embedding:,}",
                f"{count.repo:,} ({100 * count.repo / count.non_embedding:.2f}%)",
                f"{count.training_flops(tokens):.3g}".replace("e+", "e"),
            ]
        )
    header = ["model", "parameters", "N (without embedding)", "f_phi", f"FLOPs, 6 N D at D = {tokens:,}"]
    return markdown_table(header, rows) + "\n"


def _kept(
    file: Path | None, compute: Callable[[], dict[str, dict[int, float]]]
) -> dict[str, dict[int, float]]:
    """{variant: {length: score}} read from `file` if it exists, else computed and written there (if a file):
    an interrupted evaluation loses at most the model under way (the caller empties the folder when the
    inputs change)."""
    if file is not None and file.is_file():  # JSON keys are strings: the lengths back to ints
        return {v: {int(n): x for n, x in by.items()} for v, by in json.loads(file.read_text()).items()}
    result = compute()
    if file is not None:
        output.write_file(file, json.dumps(result))
    return result


def report_sections(
    models: Mapping[str, Path],
    figures: Path,
    *,
    variants: Sequence[str] = ("niah_single_1", "niah_single_2", "niah_multikey_2"),
    groups: Mapping[str, Sequence[str]] | None = None,
    samples: int = 20,
    tokens: int | None = None,
    seed: int = RULER_SEED,
    lengths: Sequence[int] | None = None,
    replaced: bool = False,
    done: int = 0,
    kept: Path | None = None,
) -> Iterator[str]:
    """Evaluate `models` ({name: HF directory of any family}, the same training length) and yield each Markdown section of
    the report as it is ready, its PNG figures written to `figures` and linked relative to `figures.parent`.
    `groups` ({name: variants}) averages NIAH per group (default: one group, `variants`). `tokens`: the token
    count of the FLOPs table (none: no table). `lengths`: NIAH's context lengths (default: the training length,
    2x and 4x); the attention and position analyses run at the first. `replaced`: a section per RePo model on how
    much its learned positions matter (NIAH and attention mass with them replaced by the token index and by one
    constant position). `done`: how many sections the caller holds already from an interrupted evaluation with the
    same inputs (with their figures); those are neither computed nor yielded. `kept`: a folder of each model's NIAH
    scores as they finish, read back by a rerun (`_kept`)."""
    configs = {name: read_config(d) for name, d in models.items()}
    trained = {training_length(c) for c in configs.values()}
    if len(trained) != 1:
        raise ValueError(
            f"the models were trained at different lengths {sorted(trained)}; compare like with like"
        )
    training = trained.pop()
    lengths = list(lengths or (training, 2 * training, 4 * training))
    length = lengths[0]  # the attention and position analyses' context
    groups = groups or {"all": list(variants)}
    variants = [v for group in groups.values() for v in group]
    repo = [name for name, config in configs.items() if repo_layer_ids(config)]

    @cache
    def loaded() -> dict[str, tuple[Any, Any]]:
        return {name: (load_model(d, length), AutoTokenizer.from_pretrained(d)) for name, d in models.items()}

    @cache
    def scored(name: str, positions: PositionSource) -> dict[str, dict[int, float]]:
        score = partial(niah_scores, {name: models[name]}, lengths, variants, samples, seed, positions)
        return _kept(kept and kept / f"niah-{output.file_stem(name)}-{positions}.json", lambda: score()[name])

    @cache
    def prompts() -> list[NeedlePrompt]:
        tokenizer = next(iter(loaded().values()))[1]
        return [
            NeedlePrompt(s.prompt, s.needle_spans, s.query_span)
            for v in variants
            for s in niah.niah_samples(tokenizer, v, length, n=max(1, samples // 4), seed=seed)
        ]

    def needles() -> str:
        scores = {name: scored(name, PositionSource.learned) for name in models}
        return f"## Needle in a haystack\n\n{niah_section(scores, training, figures, groups, samples)}"

    def attention() -> str:
        section = attention_section(loaded(), prompts(), figures, links_from=figures.parent)
        return f"## Attention mass\n\n{section.markdown}"

    def positions(name: str) -> str:
        model, tokenizer = loaded()[name]
        texts = [s.prompt for s in niah.niah_samples(tokenizer, "niah_single_2", 2 * length, n=4, seed=seed)]
        span_lengths = [length // 8, length // 4, length // 2, length]
        section = positions_section(name, model, tokenizer, texts, span_lengths, figures, figures.parent)
        return f"## Learned positions: {name}\n\n{section.markdown}"

    def replacement(name: str) -> str:
        scores = {str(source): scored(name, source) for source in PositionSource}
        return _replacement_section(name, models[name], loaded()[name], scores, prompts(), length, samples)

    sections: list[Callable[[], str]] = [needles, attention, *(partial(positions, name) for name in repo)]
    sections += [partial(replacement, name) for name in repo] if replaced else []
    if tokens is not None:
        sections.append(lambda: f"## Training cost\n\n{_flops_markdown(models, tokens)}")
    for section in sections[done:]:
        yield section()


def _replacement_section(
    name: str,
    model_dir: Path,
    learned: tuple[Any, Any],
    scores: Mapping[str, Mapping[str, Mapping[int, float]]],
    prompts: Sequence[NeedlePrompt],
    length: int,
    samples: int,
) -> str:
    """The section of `report_sections(replaced=True)` for one RePo model: `replacement_table` of its NIAH
    `scores` per position source, and the attention mass of `prompts` at `length` tokens under each source (the
    learned one from the loaded `learned` (model, tokenizer), the others loaded with theirs replaced)."""
    model, tokenizer = learned
    masses = {}
    for source in PositionSource:
        scorer = (
            model if source == PositionSource.learned else load_model(model_dir, length, positions=source)
        )
        masses[str(source)] = mean_attention_mass(
            [attention_mass(scorer, tokenizer, p.prompt, p.needle_spans, p.query_span) for p in prompts]
        )
    return (
        f"## Positions replaced: {name}\n\n{REPLACEMENT_NOTE}\n\nNIAH, percent of gold values found:\n\n"
        f"{replacement_table(scores, samples)}\nAttention of the last prompt token at {length} tokens, mean weight per "
        f"token (x1e-2), the attention section's {len(prompts)} prompt(s):\n\n{attention_mass_table(masses)}\n"
    )


def write_report(
    report: Path,
    models: Mapping[str, Path],
    *,
    title: str = "RePo report",
    preamble: str = "",
    variants: Sequence[str] = ("niah_single_1", "niah_single_2", "niah_multikey_2"),
    groups: Mapping[str, Sequence[str]] | None = None,
    samples: int = 20,
    tokens: int | None = None,
    seed: int = RULER_SEED,
    replaced: bool = False,
) -> Path:
    """Evaluate `models` ({name: HF directory}, the same training length) and write the Markdown file `report`,
    its PNG figures in `figures/` beside it; returns `report`. The options are `report_sections`'. The file is
    rewritten as each section is ready, so an interrupted evaluation leaves the sections before it."""
    report = Path(report)
    sections = [f"# {title}\n" if title else "", preamble]
    options = dict(
        variants=variants, groups=groups, samples=samples, tokens=tokens, seed=seed, replaced=replaced
    )
    for section in report_sections(models, report.parent / "figures", **options):
        sections.append(section)
        output.write_file(report, "\n".join(s.rstrip() + "\n" for s in sections if s))
    return report
