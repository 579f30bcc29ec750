"""`make demo`: a tiny RePo continual pre-training on CPU, offline, through `olmo_repo.cli.train`, and a report.

1. Converts the shipped tiny base model (`olmo_repo/demo/base_model/`, HF, the analogue of a pre-trained OLMo-2
   checkpoint; `olmo_repo.demo.base` says why and how it was built) to an OLMo checkpoint, and builds a corpus
   in OLMo's memmap format with its BPE: RULER NIAH documents of three variants (prompt and answer, from the
   generator the evaluation uses, with other seeds), short retrieval practice, stories
   (`olmo_repo.demo.corpus`), as many training windows as the steps read.
2. Continues the base with RoPE on the corpus ("stage 1", `tiny-stage1-rope.yaml`, a fresh optimizer).
3. Continues the stage-1 checkpoint, with its optimizer state, as the released recipe does ("stage 2"), four
   times on the same batches: RoPE, RePo on the layers the paper's rule picks, and NoPE on the same layers
   (the control: RePo's layers without rotation), the paper's three rows (`tiny-stage2-{rope,repo,nope}.yaml`),
   and RePo set up to learn its positions at this scale (`tiny-stage2-repo-learn.yaml`: its layers start as the
   RoPE layers they replace and hand over to f_phi, which learns at 10x the schedule's rate).
   Every run evaluates in-loop NIAH (`olmo_repo.ai2olmo.niah`, every variant, teacher-forced) when it loads its
   start and every `eval_interval` steps.
4. Plots the in-loop NIAH curves, converts the four stage-2 models to HF and evaluates them: NIAH at the
   training length and at 2x and 4x with YaRN for the variants the corpus holds ("seen") and the others
   ("held out"), attention mass, learned positions, training FLOPs (`olmo_repo.eval.report`).

Everything goes into one folder (`DemoFolder`), as stages that record their results there: a training run its
folder (metrics.jsonl, checkpoints) and wall time, a conversion its model, the curves their figure, the
evaluation its sections (`evaluation.json`) and figures. `report.md` is assembled from those records alone,
rewritten after each stage that ran: a stage a rerun skips is read back, never dropped, and a rerun that skips
everything leaves the report as it was. Each stage records a digest of its inputs: a rerun skips the stages
that finished with the same inputs (and says so), resumes a training run that was interrupted from its latest
checkpoint and an evaluation after the sections it recorded, redoes any other interrupted stage, a stage whose
inputs changed (and every stage after it), and a finished stage whose records are missing or unreadable (saying
so in one line).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf

from ..errors import CorruptFileError, RepoError
from ..integrity import require_model_dir
from ..output import PNG_SIGNATURE
from ..tables import markdown_table
from . import BASE_DIR, PROCS, SAMPLES, config_path
from .corpus import corpus_windows
from .folder import DemoFolder, digest
from .training import RunResult, latest_checkpoint, load_yaml, niah_curves, run_training, summarise

__all__ = ["STAGE2", "run_demo", "separation"]

STAGE2 = {
    "RoPE": "stage2-rope",
    "RePo": "stage2-repo",
    "RePo, learning": "stage2-repo-learn",
    "NoPE": "stage2-nope",
}
"""The stage-2 runs, by the name the report gives their models: the paper's three rows, and RePo set up to learn
its positions in 200 steps (the index blend's warm start and f_phi's own learning rate)."""

TRAINING = ["stage1-rope", *STAGE2.values()]

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

EVALUATION = "evaluation.json"  # the evaluation's record: its Markdown sections, in order
CURVES = "figures/niah-in-loop.png"
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, RepoError)  # what reading a damaged record raises
_T = TypeVar("_T")


def run_demo(
    out: Path = Path("runs/demo"),
    samples: int = SAMPLES,
    base_dir: Path = BASE_DIR,
    procs: int = PROCS,
    steps: tuple[int, int] | None = None,
    lengths: tuple[int, ...] | None = None,
) -> list[RunResult]:
    """The whole demo under `out` (see `DemoFolder`; relative to the current directory): base conversion and
    corpus, stage 1, the four stage-2 runs, their in-loop curves, their HF conversions and the evaluation
    (`samples` NIAH prompts per variant and length), with `report.md`; `procs` training processes per run;
    `steps`: the lengths of stage 1 and stage 2 (default: the configs'); `lengths`: the evaluation's NIAH
    context lengths (default: the training length, 2x and 4x). A refused folder or a damaged base
    model raises `RepoError` before anything is written; an interrupted demo resumes where it stopped."""
    start = time.monotonic()
    batch = _config("stage1-rope").global_train_batch_size
    if batch % procs:  # the same batches whatever the processes
        raise RepoError(f"procs={procs} must divide the demo's batch of {batch} sequences")
    folder = DemoFolder(out.resolve())  # before the imports below (lm-eval, transformers: seconds)
    from .base import base_tokenizer

    try:  # the base model's files first: a damaged one stops the demo before anything is written
        require_model_dir(base_dir)
        tokenizer = base_tokenizer(base_dir)
    except (OSError, CorruptFileError) as e:
        raise CorruptFileError(
            f"{e} (the shipped base model: reinstall olmo-repo, or rebuild it with `make demo-base`)"
        ) from e
    demo = _Demo(folder, base_dir, samples, procs, steps, batch, lengths)
    demo.publish()  # a report built from records that other inputs made stale loses them now
    base = demo.base(base_dir)
    demo.corpus(tokenizer)
    results = [demo.train("stage1-rope", f"--load_path={base}")]
    results += [demo.train(name, f"--load_path={results[0].checkpoint}") for name in STAGE2.values()]
    trained = f"Trained in {time.monotonic() - start:.0f} s" if demo.ran & set(TRAINING) else "Trained before"
    print(f"\n{trained}. Losses are token cross-entropy (nats).\n")
    print(_table(results), flush=True)
    demo.stage("curves", [], demo.curves, lambda resume: _plot_curves(folder))
    models = {label: demo.convert(name) for label, name in STAGE2.items()}
    demo.stage("evaluation", [EVALUATION], demo.sections, lambda resume: demo.evaluate(models, resume))
    demo.publish()
    unchanged = "" if demo.written else " (unchanged)"
    print(
        f"\nDemo finished in {time.monotonic() - start:.0f} s. Report: {folder.path / 'report.md'}{unchanged}"
    )
    return results


class _Demo:
    """One `make demo` in `folder`: every stage's inputs (known before any runs), the stages, and `report.md`
    assembled from what they recorded."""

    def __init__(
        self,
        folder: DemoFolder,
        base_dir: Path,
        samples: int,
        procs: int,
        steps: tuple[int, int] | None,
        batch: int,
        lengths: tuple[int, ...] | None,
    ):
        self.folder, self.samples, self.procs, self.written = folder, samples, procs, False
        self.lengths = lengths
        self.ran: set[str] = set()  # the stages this start ran
        lengths = [(f"--max_duration={n}", f"--stop_at={n}") for n in steps] if steps else [(), ()]
        common = (f"--data_prefix={folder.path / 'data'}", f"--device_train_microbatch_size={batch // procs}")
        self.overrides = {"stage1-rope": (*common, "--reset_optimizer_state=true", *lengths[0])}
        self.overrides.update({name: (*common, *lengths[1]) for name in STAGE2.values()})
        for name in TRAINING:
            self.overrides[name] += _in_loop_prompts(name, samples)
        self.windows = corpus_windows(steps)
        files = [p.read_bytes() for p in sorted(base_dir.iterdir()) if p.is_file()]
        inputs = {"base": digest(*files)}
        corpus_code = (Path(__file__).parent / "corpus.py").read_bytes()
        sized = [] if self.windows == corpus_windows() else [json.dumps(self.windows, sort_keys=True)]
        inputs["corpus"] = digest(inputs["base"], corpus_code, *sized)  # a full-size corpus as before sizes
        for name, upstream in zip(TRAINING, ["corpus", *["stage1-rope"] * len(STAGE2)]):
            # the folder's own path aside, so that a moved or copied demo folder is still the same demo
            overrides = [o.replace(str(folder.path), "$OUT") for o in self.overrides[name]]
            inputs[name] = digest(inputs[upstream], config_path(name).read_bytes(), *overrides)
        inputs["curves"] = digest(*(inputs[name] for name in STAGE2.values()))
        inputs.update({f"{name}-hf": inputs[name] for name in STAGE2.values()})
        # the default lengths as before the option, so that a finished demo stays finished
        inputs["evaluation"] = digest(inputs["curves"], str(samples), *([str(lengths)] if lengths else []))
        self.inputs = inputs

    def stage(self, name: str, outputs: list[str], read: Callable[[], _T], work: Callable[[bool], Any]) -> _T:
        """Stage `name`'s results, always read back from its records by `read()`. Skipped (said in one line)
        when it finished before with the same inputs and `read()` can read them; redone (said in one line)
        when it cannot; otherwise `work(resume)` runs it (resume: an interrupted start with the same inputs
        left a partial result) and returns the facts to record with it. The report is rewritten after it."""
        state = self.folder.stage(name, self.inputs[name], outputs)
        if state == "done":
            try:
                result = read()
            except _UNREADABLE as e:
                print(f"== {name}: its recorded results cannot be read ({e}); redoing it", flush=True)
                self.folder.redo(name, self.inputs[name], outputs)
                state = "new"
            else:
                print(f"== {name}: finished before with the same inputs, skipped", flush=True)
                return result
        elif state == "resume":
            print(
                f"== {name}: started before and interrupted, {'resuming' if name in [*TRAINING, 'evaluation'] else 'redoing'} it"
            )
        self.folder.finish(name, **(work(state == "resume") or {}))
        self.ran.add(name)
        self.publish()
        return read()

    def recorded(self, name: str, read: Callable[[], _T], partial: bool = False) -> _T | None:
        """`read()` of stage `name` if it finished with its current inputs (`partial`: or started with them)
        and its records can be read, else None."""
        record = self.folder.record(name)
        if record is None or record["inputs"] != self.inputs[name] or not (record["done"] or partial):
            return None
        try:
            return read()
        except _UNREADABLE:
            return None

    def base(self, base_dir: Path) -> Path:
        """The HF base model `base_dir` as an unsharded OLMo checkpoint at step 0, without optimizer state."""
        base = self.folder.path / "base"

        def work(resume: bool) -> None:
            from ..ai2olmo.hf import convert_from_hf

            convert_from_hf(base_dir, self.folder.entry("base"), force=True)
            print(f"Base model {base_dir} -> {base}", flush=True)

        return self.stage("base", ["base"], lambda: _model(base), work)

    def corpus(self, tokenizer: Any) -> None:
        """The corpus, tokenized with the base model's `tokenizer`."""
        from .corpus import build_corpus, check_corpus

        data = self.folder.path / "data"

        def work(resume: bool) -> None:
            print(f"Building the corpus under {data}...", flush=True)
            paths = build_corpus(self.folder.entry("data"), tokenizer, self.windows)
            sizes = [f"{k} {p.stat().st_size // 4:,} tokens" for k, p in paths.items() if p.suffix == ".npy"]
            print(f"   {', '.join(sizes)}", flush=True)

        self.stage("corpus", ["data"], lambda: check_corpus(data, self.windows), work)

    def train(self, name: str, load_path: str) -> RunResult:
        def work(resume: bool) -> dict[str, float]:
            self.folder.entry(f"{name}.log")  # run_training writes the full log beside the run
            save = self.folder.entry(name)
            overrides = (*self.overrides[name], load_path)
            wall = run_training(name, config_path(name), save, *overrides, procs=self.procs)
            # the checkpoint by its name in the run's folder: the demo folder may move
            return {"wall_s": wall, "checkpoint": latest_checkpoint(name, save).name}

        return self.stage(name, [name, f"{name}.log"], lambda: self.run(name), work)

    def run(self, name: str) -> RunResult:
        """Training run `name`, read back from its metrics.jsonl, with its latest checkpoint."""
        result = self.summary(name)
        require_model_dir(result.checkpoint)
        return result

    def summary(self, name: str) -> RunResult:
        """Training run `name`'s row of the report, from its metrics.jsonl."""
        record, save = self.folder.record(name), self.folder.path / name
        return summarise(name, save, record["wall_s"], save / record["checkpoint"])

    def convert(self, name: str) -> Path:
        """The HF conversion of training run `name`."""
        hf = self.folder.path / f"{name}-hf"

        def work(resume: bool) -> None:
            from ..ai2olmo.hf import convert_to_hf

            convert_to_hf(self.run(name).checkpoint, self.folder.entry(hf.name), force=True)

        return self.stage(hf.name, [hf.name], lambda: _model(hf), work)

    def curves(self) -> str:
        """The in-loop NIAH section: from the stage-2 runs' metrics.jsonl, with its figure."""
        return _require_figures(self.folder.path, _curves_section(self.folder))

    def sections(self) -> list[str]:
        """The evaluation's sections, as it recorded them, with their figures."""
        return [_require_figures(self.folder.path, s) for s in self.sections_text()]

    def sections_text(self) -> list[str]:
        """The evaluation's sections, as it recorded them."""
        sections = json.loads((self.folder.path / EVALUATION).read_text())
        if not isinstance(sections, list) or not all(isinstance(s, str) for s in sections):
            raise ValueError(f"{self.folder.path / EVALUATION} is not a list of Markdown sections")
        return sections

    def evaluate(self, models: dict[str, Path], resume: bool) -> None:
        """Evaluate `models` ({label: HF directory}) section by section, each recorded and published as it is
        ready. An interrupted evaluation (the same inputs: the same results) resumes after the sections it
        recorded whose figures are intact."""
        from ..eval.report import report_sections
        from ..upstream import lm_eval
        from .corpus import BATCH, SEQ_LEN

        print("\nEvaluating the stage-2 models for the report...", flush=True)
        lm_eval.quiet()  # lm-eval's per-task notes are noise here; its errors still show
        sections = self._intact_sections() if resume else []
        if sections:
            print(f"   {len(sections)} section(s) recorded before, kept", flush=True)
        tokens = self.run(STAGE2["RoPE"]).steps * BATCH * SEQ_LEN  # stage 2 counts its steps from 0
        figures = self.folder.entry("figures")
        self.folder.write_text(EVALUATION, json.dumps(sections, indent=1))
        for section in report_sections(
            models,
            figures,
            groups=_groups(),
            samples=self.samples,
            tokens=tokens,
            lengths=self.lengths,
            done=len(sections),
        ):
            sections.append(section)
            self.folder.write_text(EVALUATION, json.dumps(sections, indent=1))
            self.publish()

    def _intact_sections(self) -> list[str]:
        """The sections an interrupted evaluation with the current inputs recorded, up to the first whose
        record or figures cannot be read."""
        kept: list[str] = []
        for section in self.recorded("evaluation", self.sections_text, partial=True) or []:
            try:
                kept.append(_require_figures(self.folder.path, section))
            except _UNREADABLE:
                break
        return kept

    def publish(self) -> bool:
        """Rewrite report.md from the records of the stages that finished with their current inputs (the
        evaluation's also while it runs), if that changes it; returns whether it did. A section whose figure
        or checkpoint is lost stays: its stage is redone with the same inputs."""
        runs = [r for name in TRAINING if (r := self.recorded(name, lambda name=name: self.summary(name)))]
        if not runs:
            return False
        curves = self.recorded("curves", lambda: _curves_section(self.folder)) or ""
        evaluation = self.recorded("evaluation", self.sections_text, partial=True) or []
        text = "\n".join(s.rstrip() + "\n" for s in [_preamble(runs), curves, *evaluation] if s)
        written = self.folder.write_text("report.md", text)
        self.written |= written
        return written


def _config(name: str) -> Any:
    """The shipped config `tiny-{name}.yaml`, as OmegaConf reads it (unresolved: no paths needed)."""
    return load_yaml(config_path(name))


def _in_loop_prompts(name: str, samples: int) -> tuple[str, ...]:
    """The override of run `name`'s evaluators (the whole list: overrides replace lists) that gives its in-loop
    NIAH entries `samples` prompts each, or none where its config has that number already (the shipped
    configs have `SAMPLES`)."""
    entries = OmegaConf.to_container(_config(name).get("evaluators") or [], resolve=False)
    niah = [e for e in entries if str(e["label"]).startswith("niah_")]  # type: ignore[index, union-attr]
    if all(e.get("prompts") == samples for e in niah):  # type: ignore[union-attr]
        return ()
    for entry in niah:
        entry["prompts"] = samples  # type: ignore[index]
    return (f"--evaluators={json.dumps(entries, separators=(',', ':'))}",)


def _model(path: Path) -> Path:
    """`path`, once it holds a model whose weights can be read (`require_model_dir`)."""
    require_model_dir(path)
    return path


def _require_figures(root: Path, markdown: str) -> str:
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


def _table(results: list[RunResult]) -> str:
    """The console table: the runs, with their checkpoints."""
    rows = [[*row, r.checkpoint] for row, r in zip(_rows(results), results)]
    header = [*_HEADER, "checkpoint"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _groups() -> dict[str, list[str]]:
    """The NIAH variants the corpus holds ("seen") and the others ("held out")."""
    from ..eval.variants import VARIANTS
    from .corpus import NIAH_VARIANTS

    return {"seen": list(NIAH_VARIANTS), "held out": [v for v in VARIANTS if v not in NIAH_VARIANTS]}


def _layers(ids: list[int]) -> str:
    contiguous = len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1))
    return (
        f"layers {ids[0]}-{ids[-1]}"
        if contiguous
        else f"layer{'s' * (len(ids) > 1)} {', '.join(map(str, ids))}"
    )


def _preamble(results: list[RunResult]) -> str:
    """The report's title, what the demo trains (sizes from its configs) and the training table."""
    from ..modes import repo_layer_ids
    from .corpus import NIAH_VARIANTS

    base = _config("base-rope")
    model = base.model
    repo = _config("stage2-repo").model
    learn, learn_f_phi = _config("stage2-repo-learn").model, _config("stage2-repo-learn").f_phi
    return (
        "# `make demo`: tiny RePo against RoPE and NoPE\n\n"
        f"A tiny OLMo-2-shaped model (d_model {model.d_model}, {model.n_layers} layers"
        f"{', tied embeddings' if model.weight_tying else ''}, {model.max_sequence_length}-token context, "
        f"{model.vocab_size:,}-token BPE): the shipped base model (`olmo_repo/demo/base_model/`, "
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


def _in_loop(folder: DemoFolder) -> tuple[dict[str, dict[str, dict[int, float]]], dict[str, float], int]:
    """From the runs' metrics.jsonl: {label: {group: {step: exact match}}} of the stage-2 runs, the base model's
    score per group (stage 1 at its first evaluation) and the first step of stage 2."""
    groups = _groups()
    stage1 = _group_means(niah_curves(folder.path / "stage1-rope"), groups)
    runs = {label: _group_means(niah_curves(folder.path / name), groups) for label, name in STAGE2.items()}
    baseline = {g: by_step[min(by_step)] for g, by_step in stage1.items() if by_step}
    start = min(min(by_step) for run in runs.values() for by_step in run.values() if by_step)
    return runs, baseline, start


def _in_loop_setting(folder: DemoFolder) -> tuple[int, str]:
    """The length of the stage-2 runs' in-loop NIAH and its prompts per variant, as the RePo run's config says
    (its config.yaml: the shipped config with the demo's overrides)."""
    from ..eval.variants import PROMPTS

    config = load_yaml(folder.path / STAGE2["RePo"] / "config.yaml")
    prompts = {e.get("prompts") or PROMPTS for e in config.evaluators if str(e.label).startswith("niah_")}
    return config.model.max_sequence_length, " or ".join(map(str, sorted(prompts)))


def _plot_curves(folder: DemoFolder) -> None:
    from ..eval import plots

    runs, baseline, start = _in_loop(folder)
    by_group = {g: {label: run[g] for label, run in runs.items()} for g in _groups()}
    length, _ = _in_loop_setting(folder)
    title = f"In-loop NIAH (teacher-forced exact match, {length} tokens) during stage 2"
    figure = folder.entry("figures") / Path(CURVES).name
    plots.plot_niah_curves(by_group, figure, baseline=baseline, start=start, title=title)


def _curves_section(folder: DemoFolder) -> str:
    """The in-loop NIAH section: the stage-2 runs' curves (figure: `_plot_curves`), and what they show."""
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
    for group in _groups():
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
