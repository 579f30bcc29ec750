"""`make demo`'s report: the training table, the in-loop NIAH curves and what they show, from the runs' records
(the evaluation's sections come from `olmo_repo.eval.report`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...errors import CorruptFileError
from ...output import PNG_SIGNATURE
from ...tables import markdown_table
from . import STAGE2, config_path
from .training import RunResult, load_yaml, niah_curves

__all__ = [
    "CURVES",
    "SEPARATION",
    "console_table",
    "curves_section",
    "demo_config",
    "niah_groups",
    "plot_curves",
    "preamble",
    "require_figures",
    "separation",
]

_HEADER = [
    "run",
    "steps",
    "loss first",
    "loss last",
    "val loss",
    "tokens/s",
    "wall s",
    "RePo positions, layer:[min,max]",
]
SEPARATION = 0.10
"""RePo "separates" from NoPE at the first step from which it leads by at least this much, to the end."""

CURVES = "figures/niah-in-loop.png"


def demo_config(name: str) -> Any:
    """The shipped config `tiny-{name}.yaml`, as OmegaConf reads it (unresolved: no paths needed)."""
    return load_yaml(config_path(name))


def require_figures(root: Path, markdown: str) -> str:
    """`markdown`, once every figure it links (relative to `root`) is a PNG; CorruptFileError naming the first
    that is not."""
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown):
        path = root / link
        if not path.is_file():
            raise CorruptFileError(f"{path} is missing")
        with open(path, "rb") as f:
            if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                raise CorruptFileError(f"{path} is not a PNG")
    return markdown


def _rows(results: list[RunResult]) -> list[list[str]]:
    return [
        [
            r.name,
            str(r.steps),
            f"{r.first_loss:.3f}",
            f"{r.last_loss:.3f}",
            "-" if r.eval_loss is None else f"{r.eval_loss:.3f}",
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            f"{r.wall_s:.0f}",
            r.positions,
        ]
        for r in results
    ]


def console_table(results: list[RunResult]) -> str:
    """The console table: the runs, with their checkpoints."""
    rows = [[*row, r.checkpoint] for row, r in zip(_rows(results), results)]
    header = [*_HEADER, "checkpoint"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def niah_groups() -> dict[str, list[str]]:
    """The NIAH variants the corpus holds ("seen") and the others ("held out")."""
    from ...eval.variants import VARIANTS
    from .corpus import NIAH_VARIANTS

    return {"seen": list(NIAH_VARIANTS), "held out": [v for v in VARIANTS if v not in NIAH_VARIANTS]}


def _layers(ids: list[int]) -> str:
    contiguous = len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1))
    return (
        f"layers {ids[0]}-{ids[-1]}"
        if contiguous
        else f"layer{'s' * (len(ids) > 1)} {', '.join(map(str, ids))}"
    )


def preamble(results: list[RunResult]) -> str:
    """The report's title, what the demo trains (sizes from its configs) and the training table."""
    from ...modes import repo_layer_ids
    from .corpus import NIAH_VARIANTS

    base = demo_config("base-rope")
    model = base.model
    repo = demo_config("stage2-repo").model
    learn, learn_f_phi = demo_config("stage2-repo-learn").model, demo_config("stage2-repo-learn").f_phi
    return (
        "# `make demo`: tiny RePo against RoPE and NoPE\n\n"
        f"A tiny OLMo-2-shaped model (d_model {model.d_model}, {model.n_layers} layers"
        f"{', tied embeddings' if model.weight_tying else ''}, {model.max_sequence_length}-token context, "
        f"{model.vocab_size:,}-token BPE): the shipped base model (`olmo_repo/experiments/demo/base_model/`, "
        f"{base.max_duration:,} steps of RoPE pre-training, built by `make demo-base`) continued with RoPE "
        f"(stage 1), then continued from that checkpoint with RoPE, with RePo on {_layers(repo_layer_ids(repo))} "
        f'as the paper runs it, with RePo set up to learn its positions in so few steps ("RePo, learning": its '
        f"layers start as the RoPE layers they replace, p = {learn.pe_blend_init:g} of the index blend falling to 0 by "
        f"step {learn.pe_blend_steps}, and f_phi learns at {learn_f_phi.lr_multiplier:g}x the schedule's rate), "
        f"and with NoPE on the same layers (stage 2), on a generated corpus with RULER NIAH documents "
        f'({", ".join(NIAH_VARIANTS)}: the "seen" variants; seeds the evaluation does not use), short retrieval '
        f"practice and stories.\n\n## Training\n\n"
        f"{markdown_table(_HEADER, _rows(results))}\n\nLosses are token cross-entropy (nats).\n\n"
    )


def _group_means(
    curve: dict[int, dict[str, float]], groups: dict[str, list[str]]
) -> dict[str, dict[int, float]]:
    """{group: {step: mean exact match over the group's variants}} (steps with every variant only)."""
    return {
        group: {
            step: sum(scores[v] for v in variants) / len(variants)
            for step, scores in curve.items()
            if all(v in scores for v in variants)
        }
        for group, variants in groups.items()
    }


def _in_loop(folder: Path) -> tuple[dict[str, dict[str, dict[int, float]]], dict[str, float], int]:
    """From the runs' metrics.jsonl: {label: {group: {step: exact match}}} of the stage-2 runs, the base model's
    score per group (stage 1 at its first evaluation) and the first step of stage 2."""
    groups = niah_groups()
    stage1 = _group_means(niah_curves(folder / "stage1-rope"), groups)
    runs = {label: _group_means(niah_curves(folder / name), groups) for label, name in STAGE2.items()}
    baseline = {g: by_step[min(by_step)] for g, by_step in stage1.items() if by_step}
    start = min(min(by_step) for run in runs.values() for by_step in run.values() if by_step)
    return runs, baseline, start


def _in_loop_setting(folder: Path) -> tuple[int, str]:
    """The length of the stage-2 runs' in-loop NIAH and its prompts per variant, as the RePo run's config says
    (its config.yaml: the shipped config with the demo's overrides)."""
    from ...eval.variants import PROMPTS

    config = load_yaml(folder / STAGE2["RePo"] / "config.yaml")
    prompts = {e.get("prompts") or PROMPTS for e in config.evaluators if str(e.label).startswith("niah_")}
    return config.model.max_sequence_length, " or ".join(map(str, sorted(prompts)))


def plot_curves(folder: Path, figure: Path) -> None:
    """Draw the stage-2 runs' in-loop NIAH curves (from their metrics.jsonl under `folder`) into `figure`."""
    from ...eval import plots

    runs, baseline, start = _in_loop(folder)
    by_group = {g: {label: run[g] for label, run in runs.items()} for g in niah_groups()}
    length, _ = _in_loop_setting(folder)
    title = f"In-loop NIAH (teacher-forced exact match, {length} tokens) during stage 2"
    plots.plot_niah_curves(by_group, figure, baseline=baseline, start=start, title=title)


def curves_section(folder: Path) -> str:
    """The in-loop NIAH section: the stage-2 runs' curves (figure: `plot_curves`), and what they show."""
    runs, baseline, start = _in_loop(folder)
    length, prompts = _in_loop_setting(folder)
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    lines = [
        "## In-loop NIAH during stage 2\n",
        f"![in-loop NIAH]({CURVES})\n",
        f"Teacher-forced exact match of the gold answers, every variant at {length} tokens ({prompts} prompts "
        f"each; `olmo_repo.ai2olmo.niah`). The dashed line is the base model's score (stage 1, step 0: "
        f"{pct(baseline.get('seen', 0))} seen, {pct(baseline.get('held out', 0))} held out), the dotted one the "
        f"start of stage 2 (step {start}: the stage-1 weights, with f_phi inserted for RePo and the rotation "
        f"dropped for NoPE).\n",
    ]
    for group in niah_groups():
        at_start = ", ".join(
            f"{label} {pct(run[group][start])}" for label, run in runs.items() if start in run[group]
        )
        end = max(max(run[group]) for run in runs.values())
        at_end = ", ".join(
            f"{label} {pct(run[group][end])}" for label, run in runs.items() if end in run[group]
        )
        lines.append(f"- {group}: at step {start} {at_start}; at step {end} {at_end}.")
    lines.append("\n" + separation(runs["RePo"]["seen"], runs["NoPE"]["seen"]))
    return "\n".join(lines) + "\n"


def separation(repo: dict[int, float], nope: dict[int, float]) -> str:
    """Whether and when RePo leads NoPE by `SEPARATION` on the seen variants, to the end of the run."""
    steps = sorted(set(repo) & set(nope))
    gaps = {s: repo[s] - nope[s] for s in steps}
    start_gap = gaps[steps[0]]
    since = next((s for i, s in enumerate(steps) if all(gaps[t] >= SEPARATION for t in steps[i:])), None)
    head = (
        f"At the start RePo and NoPE differ by {100 * start_gap:+.0f} points on the seen variants: "
        "f_phi's init predicts positions near 0 for every token, so a RePo layer starts as a NoPE layer. "
    )
    if since is None:
        widest = max(steps, key=lambda s: gaps[s])
        return head + (
            f"RePo does not separate from NoPE within the run (a lead of {100 * SEPARATION:.0f} points that "
            f"lasts to the end); its largest lead is {100 * gaps[widest]:+.0f} points at step {widest}."
        )
    return head + (
        f"RePo separates from NoPE at step {since} (it leads by at least {100 * SEPARATION:.0f} points from "
        f"there to the end, by {100 * gaps[steps[-1]]:+.0f} at step {steps[-1]})."
    )
