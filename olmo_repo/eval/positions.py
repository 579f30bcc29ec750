"""What the learned positions look like: chunk patterns (constant / monotonic / hybrid) and spans.

The paper's analysis cuts each head's position sequence into consecutive chunks of 16 tokens and calls a
chunk, with eps = 0.2,

    constant    if max - min <= 2 * eps
    monotonic   else, if every consecutive difference has the same sign (all > 0 or all < 0)
    hybrid      otherwise

(it reports 22% constant, 4% monotonic, the rest hybrid). A sequence of T >= chunk tokens gives
floor(T / chunk) chunks: the remainder of fewer than `chunk` tokens is left out, so every chunk counted has
the same length. A sequence shorter than `chunk` is one chunk of all its tokens; a single token is constant.

The span of a head is max - min of its positions over the tokens: how much of the context's length the
positions use (the paper: it grows with the context but stays far below it; RoPE's span is T - 1).
`spans_by_length` measures it at several context lengths in one forward pass (`length_spans` from positions
already computed): the model is causal, so the positions of the first T tokens of a longer input are those of
the T-token input.

The spread and order of a layer's positions (`spread_by_layer`) are what the trainers log every step
(`olmo_repo.positions.spread`, `modes.POSITION_STATS`): min, max, std, 5th and 95th percentile over every value, and
Spearman's rank correlation of each (sequence, head) row with the token index, averaged (1: ordered as the
tokens, as RoPE's positions; 0: unrelated), so a report and a training log mean the same thing.

`model_positions` (and through it `text_positions`, `batch_positions`, `spans_by_length`) runs an HF RePo model of
any family (`repo_olmo2`, `repo_olmo3`, `repo_llama`, `repo_qwen3`: `output_positions=True`, one position per
key/value head). A model whose positions are replaced at evaluation (`pe_positions`: index or constant) predicts
none; its layers rotate by the token index or one position for every token, which is what it shows instead. The
rest is plain tensor arithmetic on {layer: positions [B, H, T]}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..modes import POSITION_STATS, PositionSource
from ..positions import spread
from ..rope import repo_layers
from ..tables import markdown_table

__all__ = [
    "PATTERNS",
    "batch_positions",
    "heads_of_positions",
    "length_spans",
    "model_positions",
    "pattern_counts",
    "pattern_table",
    "patterns_by_layer",
    "position_patterns",
    "position_spans",
    "span_table",
    "spans_by_length",
    "spread_by_layer",
    "spread_table",
    "text_positions",
]

PATTERNS = ("constant", "monotonic", "hybrid")


def _check(positions: Tensor) -> Tensor:
    if positions.ndim < 1 or positions.shape[-1] == 0:
        raise ValueError(
            f"positions need a token axis with at least one token; got shape {tuple(positions.shape)}"
        )
    if not torch.isfinite(positions).all():
        raise ValueError("positions contain NaN or infinite values")
    return positions.detach().to(torch.float64)


def pattern_counts(positions: Tensor, chunk: int = 16, eps: float = 0.2) -> Tensor:
    """Number of constant, monotonic and hybrid chunks (int64 [3]) in positions [..., T] (e.g. [B, H, T])."""
    if chunk < 1 or eps < 0:
        raise ValueError(f"chunk must be >= 1 and eps >= 0; got chunk={chunk}, eps={eps}")
    z = _check(positions)
    T = z.shape[-1]
    size = min(chunk, T)
    chunks = z[..., : T - T % size].reshape(-1, size)  # [N, size]: one row per chunk of every sequence
    constant = chunks.amax(-1) - chunks.amin(-1) <= 2 * eps
    diffs = chunks.diff(dim=-1)  # [N, size - 1]
    monotonic = ~constant & ((diffs > 0).all(-1) | (diffs < 0).all(-1))
    hybrid = ~constant & ~monotonic
    return torch.stack([constant.sum(), monotonic.sum(), hybrid.sum()])


def _fractions(counts: Tensor) -> dict[str, float]:
    total = int(counts.sum())
    return {name: int(n) / total for name, n in zip(PATTERNS, counts)}


def position_patterns(positions: Tensor, chunk: int = 16, eps: float = 0.2) -> dict[str, float]:
    """Fractions of constant, monotonic and hybrid chunks over every sequence of positions [..., T].

    Returns {"constant": f, "monotonic": f, "hybrid": f}, summing to 1. NaN or infinite positions are refused.
    """
    return _fractions(pattern_counts(positions, chunk, eps))


def patterns_by_layer(
    positions: Mapping[int, Tensor], chunk: int = 16, eps: float = 0.2
) -> dict[int | str, dict[str, float]]:
    """`position_patterns` per layer ({layer: [B, H, T]}), plus "all": every chunk of every layer pooled."""
    if not positions:
        raise ValueError("no positions given (the model has no RePo layer?)")
    counts = {layer: pattern_counts(z, chunk, eps) for layer, z in sorted(positions.items())}
    out: dict[int | str, dict[str, float]] = {layer: _fractions(c) for layer, c in counts.items()}
    out["all"] = _fractions(torch.stack(list(counts.values())).sum(0))
    return out


def position_spans(positions: Tensor) -> Tensor:
    """max - min over the tokens of positions [..., T]: [...] (e.g. [B, H]), float64."""
    z = _check(positions)
    return z.amax(-1) - z.amin(-1)


def pattern_table(patterns: Mapping[int | str, Mapping[str, float]]) -> str:
    """`patterns_by_layer`'s result as a Markdown table of percentages (one row per layer, then "all")."""
    rows = [[layer, *(f"{100 * shares[p]:.1f}%" for p in PATTERNS)] for layer, shares in patterns.items()]
    return markdown_table(["layer", *PATTERNS], rows)


@torch.no_grad()
def model_positions(model: PreTrainedModel, ids: Tensor) -> dict[int, Tensor]:
    """{layer: positions [B, H_kv, T] float32 on the CPU} of the RePo layers of an HF model (a causal LM or its
    decoder) for unpadded token ids [B, T]: f_phi's, or, where `pe_positions` replaces them (index, constant), what
    the layers rotate by instead, with no forward (`RepoLayer.rotation_positions`: the token index; one position,
    0, for every token, which rotates as none)."""
    layers = repo_layers(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no RePo layer: there are no learned positions to analyse"
        )
    if layers[0].position_source != PositionSource.learned:
        index = torch.arange(ids.shape[-1]).expand(ids.shape)  # [B, T]
        shape = (*ids.shape[:-1], len(layers[0].f_phi_rows), ids.shape[-1])  # [B, H_kv, T]
        replaced = {layer.layer_id: layer.rotation_positions(None, index) for layer in layers}
        return {i: torch.zeros(shape) if z is None else z.float() for i, z in sorted(replaced.items())}
    was_training = model.training
    model.eval()
    try:  # the decoder alone: a causal LM's output layer (logits [B, T, vocab]) holds no position
        out = model.base_model(ids.to(model.device), output_positions=True, use_cache=False)
    finally:
        model.train(was_training)
    return {layer: z.float().cpu() for layer, z in sorted(out.positions.items())}


def heads_of_positions(config: Any) -> str:
    """What the head index of the positions counts, for captions: "head", or with grouped-query attention
    "key/value head" and how many query heads share each position."""
    n_kv, n_heads = config.num_key_value_heads, config.num_attention_heads
    return "head" if n_kv == n_heads else f"key/value head ({n_heads // n_kv} query heads share its position)"


def text_positions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str, max_tokens: int | None = None
) -> tuple[dict[int, Tensor], list[str]]:
    """Positions the RePo layers of an HF RePo model predict for `text` (its first `max_tokens` tokens):
    ({layer: [H_kv, T] float32}, the text of every token, for labels)."""
    enc = tokenizer(text, return_offsets_mapping=True)
    ids = enc["input_ids"][:max_tokens]
    if not ids:
        raise ValueError("the text has no token")
    positions = model_positions(model, torch.tensor([ids]))
    labels = [
        text[a:b] if b > a else tokenizer.convert_ids_to_tokens(i)
        for i, (a, b) in zip(ids, enc["offset_mapping"])
    ]
    return {layer: z[0] for layer, z in positions.items()}, labels


def batch_positions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], n_tokens: int
) -> dict[int, Tensor]:
    """Positions of the first `n_tokens` tokens of every text (each must have that many): {layer: [B, H, T]}."""
    ids = [tokenizer(text)["input_ids"] for text in texts]
    shortest = min(len(i) for i in ids)
    if n_tokens < 1 or shortest < n_tokens:
        raise ValueError(f"need {n_tokens} tokens from every text; the shortest has {shortest}")
    return model_positions(model, torch.tensor([i[:n_tokens] for i in ids]))


def spans_by_length(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: str | Sequence[str],
    lengths: Sequence[int],
) -> dict[int, dict[int, Tensor]]:
    """Span of the positions per RePo layer and head at several context lengths: {length: {layer: [H]}}.

    Each text must have at least max(lengths) tokens; the span at length T is that of its first T tokens
    (one forward pass of max(lengths) tokens: the model is causal), averaged over the texts.
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not lengths or min(lengths) < 1:
        raise ValueError(
            f"need at least one text and lengths >= 1; got {len(texts)} texts, lengths {lengths}"
        )
    return length_spans(batch_positions(model, tokenizer, texts, max(lengths)), lengths)


def length_spans(positions: Mapping[int, Tensor], lengths: Sequence[int]) -> dict[int, dict[int, Tensor]]:
    """`spans_by_length` of positions already computed ({layer: [B, H, T]}, T >= max(lengths)): the span of the
    first n of them at each length n, averaged over the batch."""
    return {
        n: {layer: position_spans(z[..., :n]).mean(0) for layer, z in positions.items()}
        for n in sorted(lengths)
    }


def span_table(spans: Mapping[int, Mapping[int, Tensor]]) -> str:
    """`spans_by_length`'s result as a Markdown table: per length, RoPE's span (T - 1) against the mean and
    largest span over the RePo layers and heads."""
    rows = []
    for n, by_layer in spans.items():
        all_heads = torch.cat([s.flatten() for s in by_layer.values()])
        largest = all_heads.max().item()
        rows.append(
            [n, n - 1, f"{all_heads.mean().item():.2f}", f"{largest:.2f}", f"{largest / max(n - 1, 1):.3f}"]
        )
    return markdown_table(["length T", "RoPE span (T - 1)", "mean span", "max span", "max / (T - 1)"], rows)


def spread_by_layer(positions: Mapping[int, Tensor]) -> dict[int, dict[str, float]]:
    """`positions.spread` of every layer's positions ({layer: [B, H, T]}): {layer: {stat: value}} for each of
    `modes.POSITION_STATS`, the statistics the trainers log."""
    if not positions:
        raise ValueError("no positions given (the model has no RePo layer?)")
    return {layer: spread(z) for layer, z in sorted(positions.items())}


def spread_table(stats: Mapping[int, Mapping[str, float]]) -> str:
    """`spread_by_layer`'s result as a Markdown table: one row per layer, a column per `modes.POSITION_STATS`."""
    rows = [[layer, *(f"{by_stat[stat]:.3f}" for stat in POSITION_STATS)] for layer, by_stat in stats.items()]
    return markdown_table(["layer", *POSITION_STATS], rows)
