"""The analyses as report sections: models and prompts in, Markdown (tables, image links) and PNGs out.

A report (e.g. `make demo`'s `report.md`) concatenates sections; the figures are written to `out_dir`, and image
links are relative to `links_from` (default: `out_dir`), the report's folder.

- `attention_section`: attention mass on needle / query / other tokens of NIAH prompts, per model
- `positions_section`: chunk patterns, spread and order per layer, spans against context length, and one head's
  positions, for a RePo model
- `plot_head_positions`: one key/value head's positions for a text, as a PNG (`scripts/plot_positions.py`)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..integrity import ModelOpener, hf_dir_as_is
from ..modes import PositionSource
from ..output import file_stem
from . import plots
from .attention import Span, attention_mass, attention_mass_table, mean_attention_mass
from .positions import (
    batch_positions,
    heads_of_positions,
    length_spans,
    pattern_table,
    patterns_by_layer,
    span_table,
    spread_by_layer,
    spread_table,
    text_positions,
)

__all__ = [
    "NeedlePrompt",
    "Section",
    "attention_section",
    "plot_head_positions",
    "positions_section",
]

"""The first bytes of every PNG file: what may be replaced with `force`."""


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
    """Learned positions of a RePo model on `texts` (each at least max(lengths) tokens): chunk patterns and the
    spread and order per layer (`spread_by_layer`, as the trainers log them) at the longest length, spans per
    layer x head against the length, and the first text's positions in one head."""
    out_dir = Path(out_dir)
    longest = max(lengths)
    positions = batch_positions(model, tokenizer, texts, longest)  # {layer: [B, H_kv, T]}
    patterns = patterns_by_layer(positions)
    spans = length_spans(positions, lengths)  # the same forward: the model is causal
    first, tokens = text_positions(model, tokenizer, texts[0], max_tokens=min(longest, 96))
    layer = max(first)  # the last RePo layer, head 0
    head = heads_of_positions(model.config)
    file = file_stem(name)
    figures = [
        plots.plot_pattern_shares(
            patterns, out_dir / f"patterns-{file}.png", title=f"{name}: position patterns"
        ),
        plots.plot_span_heatmap(
            spans[longest], out_dir / f"spans-{file}.png", title=f"{name}: spans at {longest} tokens"
        ),
        plots.plot_spans_by_length(spans, out_dir / f"spans-by-length-{file}.png", title=f"{name}: spans"),
        plots.plot_positions(
            first[layer][0],
            tokens,
            out_dir / f"positions-{file}.png",
            title=f"{name}: layer {layer}, {head.split(' (')[0]} 0",
        ),
    ]
    markdown = (
        ("" if head == "head" else f"Positions are predicted per {head}. ")
        + f"Position patterns (chunks of 16 tokens, eps 0.2) over {len(texts)} texts of {longest} tokens:\n\n"
        f"{pattern_table(patterns)}\n\nSpread and order of the positions per layer over the same texts (std, 5th "
        "and 95th percentile of every value; rank_corr: Spearman's correlation with the token index, averaged "
        "over texts and heads: 1 is RoPE's order, 0 none):\n\n"
        f"{spread_table(spread_by_layer(positions))}\n\nSpans (max - min position) against the context length:\n\n"
        f"{span_table(spans)}\n\n" + "".join(f"![{f.stem}]({_link(f, links_from)})\n" for f in figures)
    )
    return Section(markdown, figures)


def plot_head_positions(
    model_dir: str | os.PathLike,
    text: str,
    out: Path,
    *,
    layer: int | None = None,
    head: int = 0,
    max_tokens: int = 256,
    device: str | None = None,
    force: bool = False,
    open_model: ModelOpener = hf_dir_as_is,
    positions: str = PositionSource.learned,
) -> Path:
    """Plot the positions that key/value head `head` of RePo layer `layer` (default: the first) predicts for the
    first `max_tokens` tokens of `text` against the token index, each token as a label, into the PNG `out`
    (replaced only with `force`, and only if it is a PNG). `model_dir`: an HF directory of a RePo model (any
    family), opened by `open_model` (`scripts/plot_positions.py` passes `olmo_repo.checkpoint.as_hf_dir`, which
    takes an ai2-olmo checkpoint too). Grouped-query attention: one position per key/value
    head, shared by its query heads. `positions` replaces them (`loading.position_overrides`: index, constant), and
    the plot shows what the layer rotates by instead. Raises ValueError naming the layer or head; nothing is
    written then."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..integrity import require_model_dir
    from ..modes import repo_layer_ids
    from ..output import PNG_SIGNATURE, check_replaceable_file
    from .loading import position_overrides, read_config

    check_replaceable_file(out, force, PNG_SIGNATURE, "PNG")
    require_model_dir(
        model_dir, tokenizer=True
    )  # missing, not a model or a damaged file: before anything loads
    with open_model(model_dir) as hf_dir:
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        config = read_config(hf_dir)  # the one reader: any family, its position keys and f_phi checked
        if not repo_layer_ids(config):  # before the weights load
            raise ValueError(f"{model_dir} has no RePo layer: there are no learned positions to plot")
        config.update(position_overrides(config, positions, f"{model_dir}/config.json"))
        model = AutoModelForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).to(device)
        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    by_layer, tokens = text_positions(model, tokenizer, text, max_tokens)  # {layer: [H_kv, T]}
    layer = min(by_layer) if layer is None else layer
    if layer not in by_layer:
        raise ValueError(f"layer {layer} is not a RePo layer of {model_dir}; RePo layers: {sorted(by_layer)}")
    n_heads = by_layer[layer].shape[0]
    if not 0 <= head < n_heads:
        raise ValueError(
            f"head {head} is out of range: the model has {n_heads} key/value heads (0..{n_heads - 1}), one "
            "position each"
        )
    z = by_layer[layer][head]  # [T]
    replaced = "" if positions == PositionSource.learned else f" ({positions} positions)"
    title = f"{Path(model_dir).name}{replaced}: layer {layer}, key/value head {head}, {len(tokens)} tokens, span {z.max() - z.min():.2f}"
    return plots.plot_positions(z, tokens, out, title=title)
