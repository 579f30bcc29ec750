"""`make demo`: a tiny RePo continual pre-training on CPU, offline, through `olmo_repo.cli.train`, and a report.

1. Converts the shipped tiny base model (`olmo_repo/demo/base_model/`, HF, the analogue of a pre-trained OLMo-2
   checkpoint; `olmo_repo.demo.base` says why and how it was built) to an OLMo checkpoint, and builds a corpus
   in OLMo's memmap format with its 4,096-token BPE: RULER NIAH documents of three variants (prompt and
   answer, from the generator the evaluation uses, with other seeds), short retrieval practice, stories
   (`olmo_repo.demo.corpus`).
2. Continues the base with RoPE on the corpus ("stage 1", `tiny-stage1-rope.yaml`, a fresh optimizer).
3. Continues the stage-1 checkpoint, with its optimizer state, as the released recipe does ("stage 2"), three
   times on the same batches: RoPE, RePo on layers 1-3, and NoPE on the same layers (the control: RePo's
   layers without rotation), the paper's three rows (`tiny-stage2-{rope,repo,nope}.yaml`).
   Every run evaluates in-loop NIAH (`olmo_repo.eval.inloop`, every variant, teacher-forced) when it loads its
   start and every 50 steps.
4. Writes `report.md` as each part is ready: the training table, the in-loop NIAH curves against the step
   (with the base model's and each start's scores), then, for the three stage-2 models converted to HF, NIAH
   at 512, 1024 and 2048 tokens (YaRN x2, x4) for the variants the corpus holds ("seen") and the others
   ("held out"), attention mass, learned positions, training FLOPs (`olmo_repo.eval.report`).

Everything goes into one folder (`DemoFolder`). Each stage records a digest of its inputs: a rerun skips the
stages that finished with the same inputs (and says so), resumes a training run that was interrupted from its
latest checkpoint, and redoes a stage whose inputs changed (and every stage after it).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from ..errors import CorruptFileError, RepoError
from ..integrity import require_model_dir
from ..tables import markdown_table
from . import BASE_DIR, config_path
from .folder import DemoFolder
from .training import RunResult, niah_curves, run_training, summarise

__all__ = ["PROCS", "STAGE2", "run_demo", "separation"]

STAGE2 = {"RoPE": "stage2-rope", "RePo": "stage2-repo", "NoPE": "stage2-nope"}
"""The stage-2 runs (the paper's three rows), by the name the report gives their models."""

PROCS = 2
"""Training processes per run, one thread each (`run_training`): on 2 cores this layout keeps its speed when
other work shares them, where one process with two threads slows down tenfold (bench/bench_demo_layout.py)."""

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


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


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


def _table(results: list[RunResult]) -> str:
    """The console table: the runs, with their checkpoints."""
    rows = [[*row, r.checkpoint] for row, r in zip(_rows(results), results)]
    header = [*_HEADER, "checkpoint"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _train(
    folder: DemoFolder, name: str, upstream: str, *overrides: str, procs: int
) -> tuple[RunResult, str]:
    """Stage `name`: run (or skip, or resume) its training; returns its summary and its digest."""
    from .corpus import BATCH

    config = config_path(name)
    overrides = (*overrides, f"--device_train_microbatch_size={BATCH // procs}")  # the same batches
    inputs = _digest(upstream, config.read_bytes(), *overrides)
    state = folder.stage(name, inputs, [name, f"{name}.log"])
    save = folder.entry(name)
    folder.entry(f"{name}.log")  # run_training writes the full log beside the run
    if state == "done":
        print(f"\n== {name}: finished before with the same inputs, skipped", flush=True)
        return summarise(name, save, folder.facts(name)["wall_s"]), inputs
    if state == "resume":
        print(f"\n== {name}: resuming the interrupted run from its latest checkpoint", flush=True)
    wall = run_training(name, config, save, *overrides, procs=procs)
    folder.finish(name, wall_s=wall)
    return summarise(name, save, wall), inputs


def run_demo(
    out: Path = Path("runs/demo"),
    samples: int = 10,
    base_dir: Path = BASE_DIR,
    procs: int = PROCS,
    steps: tuple[int, int] | None = None,
) -> list[RunResult]:
    """The whole demo under `out` (see `DemoFolder`; relative to the current directory): base conversion and
    corpus, stage 1, the three stage-2 runs, and the report (`samples` NIAH prompts per variant and length);
    `procs` training processes per run; `steps`: the lengths of stage 1 and stage 2 (default: the configs',
    100 and 200). A refused folder or a damaged base model raises `RepoError` before anything is written; an
    interrupted demo resumes where it stopped."""
    start = time.monotonic()
    if 8 % procs:  # corpus.BATCH, split evenly over the processes
        raise RepoError(f"procs={procs} must divide the demo's batch of 8 sequences: 1, 2, 4 or 8")
    folder = DemoFolder(out.resolve())  # before the imports below (lm-eval, transformers: seconds)
    from ..eval.report import write_report
    from ..hf.convert import convert_from_hf, convert_to_hf
    from . import corpus
    from .base import base_tokenizer

    try:  # the base model's files first: a damaged one stops the demo before anything is written
        require_model_dir(base_dir)
        tokenizer = base_tokenizer(base_dir)
    except (OSError, CorruptFileError) as e:
        raise CorruptFileError(
            f"{e} (the shipped base model: reinstall olmo-repo, or rebuild it with `make demo-base`)"
        ) from e
    base_digest = _digest(*(p.read_bytes() for p in sorted(base_dir.iterdir()) if p.is_file()))
    if folder.stage("base", base_digest, ["base"]) == "done":
        print("Base model: converted before, skipped", flush=True)
    else:  # an unsharded checkpoint at step 0, without optimizer state; written only once complete
        convert_from_hf(base_dir, folder.entry("base"), force=True)
        folder.finish("base")
        print(f"Base model {base_dir} -> {folder.path / 'base'}", flush=True)

    data_dir = folder.entry("data")
    corpus_digest = _digest(base_digest, Path(corpus.__file__).read_bytes())
    if folder.stage("corpus", corpus_digest, ["data"]) == "done":
        print(f"Corpus under {data_dir}: built before, skipped", flush=True)
    else:
        print(f"Building the corpus under {data_dir}...", flush=True)
        paths = corpus.build_corpus(data_dir, tokenizer)
        sizes = ", ".join(
            f"{k} {p.stat().st_size // 4:,} tokens" for k, p in paths.items() if p.suffix == ".npy"
        )
        print(f"   {sizes}", flush=True)
        folder.finish("corpus")

    report = folder.entry("report.md")
    figures = folder.entry("figures")
    data = f"--data_prefix={data_dir}"
    length = (
        [() for _ in range(2)]
        if steps is None
        else [(f"--max_duration={n}", f"--stop_at={n}") for n in steps]
    )
    init = (f"--load_path={folder.path / 'base'}", "--reset_optimizer_state=true", *length[0])
    stage1, stage1_digest = _train(folder, "stage1-rope", corpus_digest, data, *init, procs=procs)
    results = [stage1]
    _write(report, _preamble(results))
    digests = {}
    for label, name in STAGE2.items():
        result, digests[label] = _train(
            folder, name, stage1_digest, data, f"--load_path={stage1.checkpoint}", *length[1], procs=procs
        )
        results.append(result)
        curves = _curves_section(
            folder, figures, report.parent, done=list(STAGE2.values())[: len(results) - 1]
        )
        _write(report, _preamble(results) + curves)
    print(f"\nTrained in {time.monotonic() - start:.0f} s. Losses are token cross-entropy (nats).\n")
    print(_table(results), flush=True)

    evaluated = _digest(*digests.values(), str(samples))
    if folder.stage("report", evaluated, []) == "done":
        print(f"\nReport: evaluated before with the same models, skipped: {report}", flush=True)
        return results
    print("\nEvaluating the stage-2 models for the report...", flush=True)
    from ..upstream import lm_eval

    lm_eval.quiet()  # lm-eval's per-task notes are noise here; its errors still show
    models = {}
    for label, name in STAGE2.items():
        hf = folder.entry(f"{name}-hf")
        if folder.stage(f"{name}-hf", digests[label], [f"{name}-hf"]) != "done":
            convert_to_hf(results[1 + list(STAGE2).index(label)].checkpoint, hf, force=True)
            folder.finish(f"{name}-hf")
        models[label] = hf
    seen = list(corpus.NIAH_VARIANTS)
    write_report(
        report,
        models,
        title="",  # the preamble has it
        preamble=_preamble(results) + _curves_section(folder, figures, report.parent, list(STAGE2.values())),
        groups={"seen": seen, "held out": [v for v in _variants() if v not in seen]},
        samples=samples,
        tokens=results[1].steps * corpus.BATCH * corpus.SEQ_LEN,  # stage 2 counts its steps from 0
    )
    folder.finish("report")
    print(f"\nDemo finished in {time.monotonic() - start:.0f} s. Report: {report}", flush=True)
    return results


def _variants() -> list[str]:
    from ..eval.variants import VARIANTS

    return list(VARIANTS)


def _write(report: Path, text: str) -> None:
    staged = report.with_name(report.name + ".tmp")
    staged.write_text(text)
    staged.replace(report)


def _preamble(results: list[RunResult]) -> str:
    from .corpus import NIAH_VARIANTS, SEQ_LEN, VOCAB

    return (
        "# `make demo`: tiny RePo against RoPE and NoPE\n\n"
        f"A tiny OLMo-2-shaped model (d_model 128, 4 layers, tied embeddings, {SEQ_LEN}-token context, "
        f"{VOCAB:,}-token BPE): the shipped base model (`olmo_repo/demo/base_model/`, 4,000 steps of RoPE "
        f"pre-training, built by `make demo-base`) continued with RoPE (stage 1), then continued from that "
        f"checkpoint with RoPE, with RePo on layers 1-3 and with NoPE on the same layers (stage 2), on a generated "
        f'corpus with RULER NIAH documents ({", ".join(NIAH_VARIANTS)}: the "seen" variants; seeds the '
        f"evaluation does not use), short retrieval practice and stories.\n\n## Training\n\n"
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


def _curves_section(folder: DemoFolder, figures: Path, links_from: Path, done: list[str]) -> str:
    """The in-loop NIAH section: the curves of the finished stage-2 runs `done`, and what they show."""
    from ..eval import plots
    from .corpus import NIAH_VARIANTS

    if not done:
        return ""
    seen = list(NIAH_VARIANTS)
    groups = {"seen": seen, "held out": [v for v in _variants() if v not in seen]}
    stage1 = _group_means(niah_curves(folder.path / "stage1-rope"), groups)
    names = {name: label for label, name in STAGE2.items()}
    runs = {names[name]: _group_means(niah_curves(folder.path / name), groups) for name in done}
    baseline = {g: by_step[min(by_step)] for g, by_step in stage1.items() if by_step}
    start = min(min(by_step) for run in runs.values() for by_step in run.values() if by_step)
    by_group = {g: {label: run[g] for label, run in runs.items()} for g in groups}
    figure = plots.plot_niah_curves(
        by_group,
        figures / "niah-in-loop.png",
        baseline=baseline,
        start=start,
        title="In-loop NIAH (teacher-forced exact match, 512 tokens) during stage 2",
    )
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    lines = [
        "## In-loop NIAH during stage 2\n",
        f"![in-loop NIAH]({figure.relative_to(links_from)})\n",
        f"Teacher-forced exact match of the gold answers, every variant at 512 tokens (10 prompts each; "
        f"`olmo_repo.eval.inloop`). The dashed line is the base model's score (stage 1, step 0: "
        f"{pct(baseline.get('seen', 0))} seen, {pct(baseline.get('held out', 0))} held out), the dotted one the "
        f"start of stage 2 (step {start}: the stage-1 weights, with f_phi inserted for RePo and the rotation "
        f"dropped for NoPE).\n",
    ]
    for group in groups:
        at_start = ", ".join(
            f"{label} {pct(run[group][start])}" for label, run in runs.items() if start in run[group]
        )
        end = max(max(run[group]) for run in runs.values())
        at_end = ", ".join(
            f"{label} {pct(run[group][end])}" for label, run in runs.items() if end in run[group]
        )
        lines.append(f"- {group}: at step {start} {at_start}; at step {end} {at_end}.")
    if "RePo" in runs and "NoPE" in runs:
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
