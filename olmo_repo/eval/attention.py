"""Attention mass on needle / query / other tokens of a NIAH prompt (the paper's attention analysis).

The token that predicts the answer is the last token of the prompt. Its attention row in every layer,
averaged over heads, is reduced to the mean weight *per token* of three groups:

    needle   tokens overlapping a needle's character span (the sentence that holds the answer)
    query    tokens overlapping the query's character span (the question at the end of the prompt)
    other    every other token (the haystack, special tokens)

The paper reports these in units of 1e-2, averaged over layers and prompts: RePo 2.013 / 1.046 / 0.015
against 1.754 / 1.123 / 0.014 for linear positions (RoPE). `attention_mass_table` gives them for all layers
and for the RePo layers alone.

Weights come from eager attention (the model is switched to `eager` for the forward and back afterwards).
Forward hooks keep only the last query row of each layer ([B, H, T] instead of [B, H, T, T] per layer), so a
4K prompt costs one layer's attention matrix at a time. The attentions are reached through
`olmo_repo.hf.attention_modules` (each decoder layer's `self_attn`), so every family reads the same: OLMo 2/3,
Llama and Qwen 3, stock or RePo (RePo, NoPE, hybrids). Their eager weights have one row per query head: with
grouped-query attention each key/value head's keys are repeated for its query group, and the heads averaged here
are the query heads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..hf import attention_modules
from ..modes import repo_layer_ids
from ..tables import markdown_table
from ..upstream.transformers import attn_implementation

__all__ = [
    "GROUPS",
    "AttentionMass",
    "attention_mass",
    "attention_mass_table",
    "group_mass",
    "mean_attention_mass",
    "token_groups",
]

GROUPS = ("needle", "query", "other")
NEEDLE, QUERY, OTHER = range(3)
Span = tuple[int, int]


def token_groups(offsets: Sequence[Span], needle_spans: Sequence[Span], query_span: Span) -> Tensor:
    """Group of every token (int64 [T]: 0 needle, 1 query, 2 other) from its character offsets (a, b).

    A token belongs to a span [s, e) when its characters overlap it (a < e and b > s); tokens without
    characters (special tokens, offsets (0, 0)) are `other`. Every span must cover at least one token, and no
    token may be in both a needle and the query.
    """
    if not needle_spans:
        raise ValueError("no needle span given")
    groups = torch.full((len(offsets),), OTHER, dtype=torch.long)
    for group, spans in ((NEEDLE, needle_spans), (QUERY, [query_span])):
        for s, e in spans:
            if not 0 <= s < e:
                raise ValueError(
                    f"{GROUPS[group]} span ({s}, {e}) is not a character span: need 0 <= start < end"
                )
            hit = torch.tensor([a < e and b > s and b > a for a, b in offsets], dtype=torch.bool)
            if not hit.any():
                raise ValueError(f"{GROUPS[group]} span ({s}, {e}) covers no token of the prompt")
            if group == QUERY and (groups[hit] == NEEDLE).any():
                raise ValueError(f"query span ({s}, {e}) overlaps a needle span")
            groups[hit] = group
    return groups


def group_mass(weights: Tensor, groups: Tensor) -> Tensor:
    """Mean attention weight per token of each group: weights [L, H, T] (one query row per layer and head),
    groups [T] (0 needle, 1 query, 2 other) -> [L, 3] float64, heads averaged first."""
    if weights.ndim != 3 or weights.shape[-1] != groups.shape[0]:
        raise ValueError(
            f"weights [L, H, T] and groups [T] disagree: {tuple(weights.shape)}, {tuple(groups.shape)}"
        )
    counts = torch.bincount(groups, minlength=len(GROUPS))
    if (counts == 0).any():
        empty = [name for name, n in zip(GROUPS, counts) if n == 0]
        raise ValueError(f"no token in group(s) {empty}: every group needs at least one token")
    row = weights.detach().to(torch.float64).mean(1)  # [L, T]
    sums = torch.zeros(row.shape[0], len(GROUPS), dtype=torch.float64).index_add_(1, groups, row)  # [L, 3]
    return sums / counts


@dataclass(frozen=True)
class AttentionMass:
    """Mean attention weight per token of needle, query and other tokens, per layer (see the module doc)."""

    per_layer: Tensor
    """[L, 3] float64: columns in `GROUPS` order; plain weights (multiply by 100 for the paper's x1e-2)."""
    repo_layers: tuple[int, ...]
    """The model's RePo layers (empty for RoPE, NoPE and stock models)."""

    def reduce(self, layers: Sequence[int] | None = None) -> dict[str, float]:
        """{group: mean over `layers` (default: all)} in plain weights."""
        rows = self.per_layer if layers is None else self.per_layer[list(layers)]
        return dict(zip(GROUPS, rows.mean(0).tolist()))


def mean_attention_mass(masses: Sequence[AttentionMass]) -> AttentionMass:
    """The average over prompts (each layer and group averaged separately)."""
    if not masses:
        raise ValueError("no attention masses to average")
    if len({m.repo_layers for m in masses}) > 1 or len({m.per_layer.shape for m in masses}) > 1:
        raise ValueError("attention masses of different models cannot be averaged")
    return AttentionMass(torch.stack([m.per_layer for m in masses]).mean(0), masses[0].repo_layers)


@contextmanager
def _eager(model: PreTrainedModel) -> Iterator[None]:
    """Run `model` with eager attention (the only implementation that returns weights), then switch back."""
    previous = attn_implementation(model)
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if previous != "eager":
            model.set_attn_implementation(previous)


@contextmanager
def _last_rows(model: PreTrainedModel) -> Iterator[dict[int, Tensor]]:
    """Collect {layer: attention weights of the last query token [B, H, T]} while the model runs."""
    rows: dict[int, Tensor] = {}

    def keep(layer: int, out: tuple[Tensor, Tensor | None]) -> None:
        if out[1] is None:
            raise RuntimeError(f"layer {layer} returned no attention weights (not eager attention)")
        rows[layer] = out[1][:, :, -1, :].detach()  # [B, H, T, T] -> [B, H, T], H query heads

    hooks = [
        m.register_forward_hook(lambda _m, _args, out, i=i: keep(i, out))
        for i, m in enumerate(attention_modules(model))
    ]
    try:
        yield rows
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def attention_mass(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    needle_spans: Sequence[Span],
    query_span: Span,
) -> AttentionMass:
    """Attention mass of one NIAH prompt under an HF model of any family here (stock or RePo).

    `needle_spans` (one per needle) and `query_span` are character spans [start, end) of `prompt`; a fast
    tokenizer maps them to tokens through its offsets. The prompt is tokenized as the tokenizer does by
    default; the row is that of the last token that carries text of the prompt.
    """
    enc = tokenizer(prompt, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    with_text = [i for i, (a, b) in enumerate(offsets) if b > a]
    if not with_text:
        raise ValueError("the prompt has no text token")
    last = with_text[-1]
    groups = token_groups(offsets[: last + 1], needle_spans, query_span)  # [T]
    ids = torch.tensor([enc["input_ids"][: last + 1]], device=model.device)  # [1, T]
    was_training = model.training
    model.eval()
    try:
        with _eager(model), _last_rows(model) as rows:
            model(ids, use_cache=False)
    finally:
        model.train(was_training)
    weights = torch.stack([rows[i][0] for i in sorted(rows)]).cpu()  # [L, H, T]
    return AttentionMass(group_mass(weights, groups), tuple(repo_layer_ids(model.config)))


def attention_mass_table(results: Mapping[str, AttentionMass]) -> str:
    """A Markdown table in the paper's units (x1e-2): needle / query / other for all layers and RePo layers.

    A model without RePo layers (RoPE, NoPE) is reduced over the RePo layers of the other models in the
    table, when they all agree (the same depths, for comparison); otherwise that column is left empty.
    """
    own = {m.repo_layers for m in results.values() if m.repo_layers}
    shared = next(iter(own)) if len(own) == 1 else ()
    rows = []
    for name, mass in results.items():
        layers = mass.repo_layers or shared
        cells = [f"{100 * v:.3f}" for v in mass.reduce().values()]
        if layers:
            cells += [f"{100 * v:.3f}" for v in mass.reduce(layers).values()]
            cells.append(_layer_range(layers))
        else:
            cells += ["", "", "", ""]
        rows.append([name, *cells])
    header = [
        "model",
        *(f"{g} (all)" for g in GROUPS),
        *(f"{g} (RePo layers)" for g in GROUPS),
        "RePo layers",
    ]
    return markdown_table(header, rows)


def _layer_range(layers: Sequence[int]) -> str:
    layers = sorted(layers)
    contiguous = layers == list(range(layers[0], layers[-1] + 1))
    return f"{layers[0]}..{layers[-1]}" if contiguous and len(layers) > 1 else ",".join(map(str, layers))
