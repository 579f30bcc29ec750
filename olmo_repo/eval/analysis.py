"""The analyses as report sections: models and prompts in, Markdown (tables, image links) and PNGs out.

A report (e.g. `make demo`'s `report.md`) concatenates sections; the figures are written to `out_dir`, and image
links are relative to `links_from` (default: `out_dir`), the report's folder.

- `attention_section`: attention mass on needle / query / other tokens of NIAH prompts, per model
- `positions_section`: chunk patterns, spans against context length, and one head's positions, for a RePo model
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from . import plots
from .attention import Span, attention_mass, attention_mass_table, mean_attention_mass
from .positions import (
    batch_positions,
    heads_of_positions,
    pattern_table,
    patterns_by_layer,
    span_table,
    spans_by_length,
    text_positions,
)

__all__ = ["NeedlePrompt", "Section", "attention_section", "positions_section"]


@dataclass(frozen=True)
class NeedlePrompt:
    """A NIAH prompt with the character spans [start, end) of its needle(s) and of its question."""

    prompt: str
    needle_spans: Sequence[Span]
    query_span: Span


@dataclass
class Section:
    markdown: str
    """Tables and image links (relative to the folder of the figures)."""
    figures: list[Path] = field(default_factory=list)
    """The PNG files written."""


def _link(figure: Path, links_from: Path | None) -> str:
    return Path(os.path.relpath(figure, links_from or figure.parent)).as_posix()


def attention_section(
    models: Mapping[str, tuple[PreTrainedModel, PreTrainedTokenizerBase]],
    prompts: Sequence[NeedlePrompt],
    out_dir: Path,
    links_from: Path | None = None,
) -> Section:
    """Attention mass averaged over `prompts`, per model: the table (x1e-2) and `attention-mass.png`."""
    if not prompts:
        raise ValueError("no NIAH prompts for the attention analysis")
    results = {}
    for name, (model, tokenizer) in models.items():
        masses = [
            attention_mass(model, tokenizer, p.prompt, p.needle_spans, p.query_span)
            for p in tqdm(prompts, desc=f"attention mass, {name}", unit="prompt")
        ]
        results[name] = mean_attention_mass(masses)
    figure = plots.plot_attention_mass(results, Path(out_dir) / "attention-mass.png")
    markdown = (
        f"Attention of the last prompt token, mean weight per token (x1e-2), averaged over heads and "
        f"{len(prompts)} prompts:\n\n{attention_mass_table(results)}\n\n![attention mass]({_link(figure, links_from)})\n"
    )
    return Section(markdown, [figure])


def positions_section(
    name: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    lengths: Sequence[int],
    out_dir: Path,
    links_from: Path | None = None,
) -> Section:
    """Learned positions of a RePo model on `texts` (each at least max(lengths) tokens): chunk patterns at the
    longest length, spans per layer x head against the length, and the first text's positions in one head."""
    out_dir = Path(out_dir)
    longest = max(lengths)
    patterns = patterns_by_layer(batch_positions(model, tokenizer, texts, longest))
    spans = spans_by_length(model, tokenizer, texts, lengths)
    first, tokens = text_positions(model, tokenizer, texts[0], max_tokens=min(longest, 96))
    layer = max(first)  # the last RePo layer, head 0
    head = heads_of_positions(model.config)
    figures = [
        plots.plot_pattern_shares(
            patterns, out_dir / f"patterns-{name}.png", title=f"{name}: position patterns"
        ),
        plots.plot_span_heatmap(
            spans[longest], out_dir / f"spans-{name}.png", title=f"{name}: spans at {longest} tokens"
        ),
        plots.plot_spans_by_length(spans, out_dir / f"spans-by-length-{name}.png", title=f"{name}: spans"),
        plots.plot_positions(
            first[layer][0],
            tokens,
            out_dir / f"positions-{name}.png",
            title=f"{name}: layer {layer}, {head.split(' (')[0]} 0",
        ),
    ]
    markdown = (
        ("" if head == "head" else f"Positions are predicted per {head}. ")
        + f"Position patterns (chunks of 16 tokens, eps 0.2) over {len(texts)} texts of {longest} tokens:\n\n"
        f"{pattern_table(patterns)}\n\nSpans (max - min position) against the context length:\n\n"
        f"{span_table(spans)}\n\n" + "".join(f"![{f.stem}]({_link(f, links_from)})\n" for f in figures)
    )
    return Section(markdown, figures)
