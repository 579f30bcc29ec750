"""Plots of the analyses, as PNG files (matplotlib's object API on the Agg canvas: no display, no pyplot state).

- `plot_positions`: the positions one RePo head predicts against the token index, with token labels
- `plot_span_heatmap`: span of the positions per layer x head
- `plot_spans_by_length`: spans against the context length, beside RoPE's (T - 1)
- `plot_pattern_shares`: constant / monotonic / hybrid shares per layer
- `plot_attention_mass`: attention mass on needle / query / other tokens per layer, per model
- `plot_niah_accuracy`: NIAH score against context length, per model
- `plot_niah_curves`: in-loop NIAH score against the training step, per model and group of variants
- `plot_loss_curves`: training loss against the step, per run, with held-out losses as points

Each takes the result of the matching analysis function and a path, writes the PNG (creating its folder) and
returns the path.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from .attention import GROUPS, AttentionMass
from .positions import PATTERNS

__all__ = [
    "plot_attention_mass",
    "plot_learned_shares",
    "plot_loss_curves",
    "plot_loss_panels",
    "plot_niah_accuracy",
    "plot_niah_curves",
    "plot_pattern_shares",
    "plot_positions",
    "plot_span_heatmap",
    "plot_spans_by_length",
]

PathLike = str | Path
_MAX_LABELS = 96  # token labels on one axis before they are thinned out


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _save(fig: Figure, path: PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path


def _finish(fig: Figure, ax: Axes, path: PathLike, *, xlabel: str, ylabel: str, title: str) -> Path:
    """A one-panel line or point figure's labels, grid, legend and title, saved to `path`."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a legend only where something is labelled
        ax.legend(fontsize=8)
    ax.set_title(title)
    return _save(fig, path)


def _label(token: str) -> str:
    """A token as a tick label: visible whitespace, no mathtext ($)."""
    token = token.replace("$", r"\$").replace("\n", "\\n").replace("\t", "\\t")
    return token if token.strip() else token.replace(" ", "\u2423") or "''"


def plot_positions(positions: Tensor, tokens: Sequence[str], path: PathLike, *, title: str = "") -> Path:
    """Positions [T] of one head against the token index, each point labelled with its token (every k-th
    token when there are more than 96)."""
    z = positions.detach().double().cpu()
    if z.ndim != 1 or z.numel() != len(tokens) or z.numel() == 0:
        raise ValueError(
            f"positions must be [T] with one token per position; got {tuple(z.shape)}, {len(tokens)}"
        )
    T = z.numel()
    step = -(-T // _MAX_LABELS)  # ceil
    fig, (ax,) = _figure(min(max(8.0, 0.16 * min(T, _MAX_LABELS) + 2), 24.0), 5.0)
    ax.plot(range(T), z.tolist(), marker="o", markersize=3 if T > 200 else 4, linewidth=1)
    ticks = list(range(0, T, step))
    ax.set_xticks(ticks, [_label(tokens[i]) for i in ticks], rotation=90, fontsize=8, family="monospace")
    ax.set_xlim(-0.5, T - 0.5)
    ax.set_xlabel("token" + (f" (one label every {step} tokens)" if step > 1 else ""))
    ax.set_ylabel("predicted position")
    ax.grid(alpha=0.3)
    ax.set_title(
        title or f"positions of {T} tokens (span {z.max() - z.min():.2f}; RoPE would use 0..{T - 1})"
    )
    return _save(fig, path)


def plot_span_heatmap(spans: Mapping[int, Tensor], path: PathLike, *, title: str = "") -> Path:
    """Spans {layer: [H]} (as `position_spans` / `spans_by_length` give them) as a layer x head heat map."""
    if not spans:
        raise ValueError("no spans to plot (the model has no RePo layer?)")
    layers = sorted(spans)
    grid = torch.stack([spans[layer].detach().double().cpu().flatten() for layer in layers])  # [L, H]
    L, H = grid.shape
    fig, (ax,) = _figure(min(max(5.0, 0.45 * H + 2.5), 20.0), min(max(3.0, 0.4 * L + 1.5), 16.0))
    image = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis")
    fig.colorbar(image, ax=ax, label="span (max - min position)")
    ax.set_xticks(range(H), [str(h) for h in range(H)] if H <= 32 else None)
    ax.set_yticks(range(L), [str(layer) for layer in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if L * H <= 256:  # values in the cells while they fit
        middle = (grid.max() + grid.min()) / 2
        for i in range(L):
            for h in range(H):
                color = "black" if grid[i, h] > middle else "white"
                value = grid[i, h].item()
                text = f"{value:.0f}" if value >= 100 else f"{value:.3g}"
                ax.text(h, i, text, ha="center", va="center", fontsize=7, color=color)
    ax.set_title(title or "span of the learned positions per layer and head")
    return _save(fig, path)


def plot_spans_by_length(
    spans: Mapping[int, Mapping[int, Tensor]], path: PathLike, *, title: str = ""
) -> Path:
    """`spans_by_length`'s {length: {layer: [H]}}: largest and mean span over heads per layer against the
    context length, with RoPE's span T - 1 for scale (log axes)."""
    if not spans:
        raise ValueError("no spans to plot")
    lengths = sorted(spans)
    layers = sorted(next(iter(spans.values())))
    fig, (ax,) = _figure(8.0, 4.5)
    ax.plot(lengths, [n - 1 for n in lengths], "k--", label="RoPE (T - 1)")
    colors = [f"C{i % 10}" for i in range(len(layers))]
    for layer, color in zip(layers, colors):
        ax.plot(
            lengths,
            [spans[n][layer].max().item() for n in lengths],
            "o-",
            color=color,
            label=f"layer {layer} max",
        )
        ax.plot(lengths, [spans[n][layer].mean().item() for n in lengths], "o:", color=color, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("context length T (tokens)")
    ax.set_ylabel("span (max - min position)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(
        fontsize=8,
        title="solid: max over heads\ndotted: mean",
        title_fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1, 1),
    )
    ax.set_title(title or "span of the learned positions against the context length")
    return _save(fig, path)


def plot_pattern_shares(
    patterns: Mapping[int | str, Mapping[str, float]], path: PathLike, *, title: str = ""
) -> Path:
    """`patterns_by_layer`'s shares as stacked bars per layer (and "all")."""
    if not patterns:
        raise ValueError("no patterns to plot")
    names = [str(layer) for layer in patterns]
    fig, (ax,) = _figure(max(5.0, 0.6 * len(names) + 3), 4.0)
    bottom = [0.0] * len(names)
    for pattern, color in zip(PATTERNS, ("#4C72B0", "#DD8452", "#8C8C8C")):
        shares = [100 * patterns[layer][pattern] for layer in patterns]
        bars = ax.bar(names, shares, bottom=bottom, color=color, label=pattern)
        ax.bar_label(bars, [f"{s:.0f}" if s >= 4 else "" for s in shares], label_type="center", fontsize=7)
        bottom = [b + s for b, s in zip(bottom, shares)]
    ax.set_ylim(0, 100)
    ax.set_xlabel("layer")
    ax.set_ylabel("% of chunks")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(title or "position patterns per chunk of 16 tokens")
    return _save(fig, path)


def plot_attention_mass(results: Mapping[str, AttentionMass], path: PathLike, *, title: str = "") -> Path:
    """Per-layer attention mass (x1e-2) on needle / query / other tokens, one line per model; RePo layers
    shaded."""
    if not results:
        raise ValueError("no attention masses to plot")
    fig, axes = _figure(13.0, 3.8, ncols=len(GROUPS))
    repo = sorted({layer for mass in results.values() for layer in mass.repo_layers})
    for g, (ax, group) in enumerate(zip(axes, GROUPS)):
        for layer in repo:
            ax.axvspan(layer - 0.5, layer + 0.5, color="0.92", zorder=0)
        for name, mass in results.items():
            ax.plot((100 * mass.per_layer[:, g]).tolist(), "o-", markersize=4, label=name)
        ax.set_xticks(range(next(iter(results.values())).per_layer.shape[0]))
        ax.set_title(group)
        ax.set_xlabel("layer" + (" (shaded: RePo)" if repo else ""))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean weight per token (x1e-2)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(title or "attention of the last prompt token")
    return _save(fig, path)


def plot_niah_accuracy(scores: Mapping[str, Mapping[int, float]], path: PathLike, *, title: str = "") -> Path:
    """NIAH scores {model: {context length: score}} against the length, one line per model."""
    if not scores or not all(scores.values()):
        raise ValueError("no NIAH scores to plot")
    fig, (ax,) = _figure(6.5, 4.0)
    lengths = sorted({n for by_length in scores.values() for n in by_length})
    for name, by_length in scores.items():
        xs = sorted(by_length)
        ax.plot(xs, [by_length[n] for n in xs], "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    top = max(v for by_length in scores.values() for v in by_length.values())
    ax.set_ylim(0, 1.05 if top <= 1 else 105)  # fractions or percentages
    return _finish(fig, ax, path, xlabel="context length (tokens)", ylabel="NIAH score",
                   title=title or "needle in a haystack against context length")  # fmt: skip


def plot_niah_curves(
    curves: Mapping[str, Mapping[str, Mapping[int, float]]],
    path: PathLike,
    *,
    baseline: Mapping[str, float] | None = None,
    start: int | None = None,
    ylabel: str = "NIAH exact match (%)",
    title: str = "",
) -> Path:
    """In-loop NIAH scores against the training step: one panel per group of variants ({group: {model: {step:
    score in [0, 1]}}), one line per model. `baseline` ({group: score}) is drawn as a dashed line (e.g. the
    model training started from), `start` as a dotted vertical line (e.g. where a new stage began)."""
    if not curves or not all(curves.values()):
        raise ValueError("no curves to plot")
    fig, axes = _figure(5.5 * len(curves), 4.0, ncols=len(curves))
    for ax, (group, by_model) in zip(axes, curves.items()):
        for i, (model, by_step) in enumerate(by_model.items()):
            steps = sorted(by_step)
            marker = "osD^v"[i % 5]  # lines that coincide stay visible
            ax.plot(steps, [100 * by_step[s] for s in steps], marker=marker, markersize=7 - i, label=model)
        if baseline is not None and group in baseline:
            ax.axhline(100 * baseline[group], color="grey", linestyle="--", linewidth=1, label="base model")
        if start is not None:
            ax.axvline(start, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(-3, 103)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.set_title(group)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_loss_panels(
    curves: Mapping[str, Mapping[str, Mapping[int, float]]],
    path: PathLike,
    *,
    marked: Collection[tuple[str, str]] = (),
    reference: tuple[float, str] | None = None,
    ylabel: str = "loss",
    title: str = "",
) -> Path:
    """Many runs' losses against the step: one panel per group ({group: {run: {step: loss}}}, up to four panels a
    row, a shared log y axis), one thin line per run, in C0 where (group, run) is `marked` (e.g. the runs that
    learned) and C1 elsewhere; `reference` (value, label) as a dashed line in every panel (e.g. chance)."""
    if (
        not curves
        or not all(curves.values())
        or not all(c for runs in curves.values() for c in runs.values())
    ):
        raise ValueError("no loss curves to plot")
    cols = min(4, len(curves))
    rows = -(-len(curves) // cols)
    fig = Figure(figsize=(3.6 * cols, 2.9 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False, sharey=True).flat)
    for ax, (group, runs) in zip(axes, curves.items()):
        for run, by_step in runs.items():
            steps = sorted(by_step)
            ax.plot(steps, [by_step[s] for s in steps], linewidth=1.0,
                    color="C0" if (group, run) in marked else "C1")  # fmt: skip
        if reference is not None:
            ax.axhline(reference[0], color="grey", linestyle="--", linewidth=1, label=reference[1])
        ax.set_yscale("log")
        ax.set_title(f"{group} ({len(runs)})", fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    for ax in axes[len(curves) :]:
        ax.set_axis_off()
    axes[0].set_ylabel(ylabel)
    if reference is not None:
        axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_loss_curves(
    curves: Mapping[str, Mapping[int, float]],
    path: PathLike,
    *,
    points: Mapping[str, Mapping[int, float]] | None = None,
    baseline: float | None = None,
    title: str = "",
) -> Path:
    """Training losses {run: {step: loss}} against the step, one line per run; `points` ({run: {step: loss}},
    e.g. held-out losses) as markers in their run's colour, `baseline` (e.g. the starting model's held-out loss)
    as a dashed line."""
    if not curves or not all(curves.values()):
        raise ValueError("no loss curves to plot")
    fig, (ax,) = _figure(6.5, 4.0)
    for i, (name, by_step) in enumerate(curves.items()):
        steps = sorted(by_step)
        (line,) = ax.plot(
            steps, [by_step[s] for s in steps], linewidth=1.2, label=f"{name}, training batches"
        )
        held = (points or {}).get(name, {})
        if held:
            xs = sorted(held)
            ax.plot(xs, [held[s] for s in xs], "osD^v"[i % 5], color=line.get_color(), markersize=7,
                    linestyle=":", label=f"{name}, held out")  # fmt: skip
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="starting model, held out")
    return _finish(fig, ax, path, xlabel="training step", ylabel="cross-entropy (nats per token)",
                   title=title or "loss against the training step")  # fmt: skip


def plot_learned_shares(learned: Mapping[str, tuple[int, int]], path: PathLike, *, title: str = "") -> Path:
    """{arm: (models that learned, models)}: each arm's share with its Wilson 95% interval over its models, one
    row per arm, top to bottom in the order given, "k/n" beside it."""
    from .intervals import wilson_interval

    if not learned or any(n < 1 or not 0 <= k <= n for k, n in learned.values()):
        raise ValueError(f"no learned shares to plot: {dict(learned)}")
    fig, (ax,) = _figure(8.5, 0.9 + 0.45 * len(learned))  # room for the arms' long names and the title
    for row, (k, n) in enumerate(learned.values()):
        low, high = wilson_interval(k / n, n)
        ax.errorbar([100 * k / n], [row], xerr=[[100 * max(k / n - low, 0.0)], [100 * max(high - k / n, 0.0)]], fmt="o",
                    capsize=4, color="C0")  # fmt: skip
        ax.annotate(f"{k}/{n}", (100 * high, row), xytext=(6, 0), textcoords="offset points", va="center")
    ax.set_yticks(range(len(learned)), list(learned))
    ax.set_ylim(len(learned) - 0.5, -0.5)  # the first arm on top
    ax.set_xlim(-2, 112)
    return _finish(fig, ax, path, xlabel="models that learned (%), with the Wilson 95% interval over seeds", ylabel="",
                   title=title or "share of seeds that learned")  # fmt: skip
