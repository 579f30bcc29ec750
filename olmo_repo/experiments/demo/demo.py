"""`make demo`: a tiny RePo continual pre-training on CPU, offline, through `olmo_repo.cli.train`, and a report.

1. Converts the shipped tiny base model (`olmo_repo/experiments/demo/base_model/`, HF, the analogue of a pre-trained OLMo-2
   checkpoint; `olmo_repo.experiments.demo.base` says why and how it was built) to an OLMo checkpoint, and builds a corpus
   in OLMo's memmap format with its BPE: RULER NIAH documents of three variants (prompt and answer, from the
   generator the evaluation uses, with other seeds), short retrieval practice, stories
   (`olmo_repo.experiments.demo.corpus`), as many training windows as the steps read.
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

Everything goes into one folder (`olmo_repo.experiments.stages`), as stages that record their results there: a training run its
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
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ...errors import CorruptFileError, RepoError
from ...integrity import require_model_dir
from ..stages import UNREADABLE, Stages, digest
from . import BASE_DIR, PROCS, SAMPLES, STAGE2, TRAINING, config_path
from .corpus import corpus_windows
from .report import (
    CURVES,
    console_table,
    curves_section,
    demo_config,
    niah_groups,
    plot_curves,
    preamble,
    require_figures,
)
from .training import RunResult, latest_checkpoint, run_training, summarise

__all__ = ["run_demo"]

EVALUATION = "evaluation.json"  # the evaluation's record: its Markdown sections, in order


def run_demo(
    out: Path = Path("runs/demo"),
    samples: int = SAMPLES,
    base_dir: Path = BASE_DIR,
    procs: int = PROCS,
    steps: tuple[int, int] | None = None,
    lengths: tuple[int, ...] | None = None,
) -> list[RunResult]:
    """The whole demo under `out` (see `olmo_repo.experiments.stages`; relative to the current directory): base conversion and
    corpus, stage 1, the four stage-2 runs, their in-loop curves, their HF conversions and the evaluation
    (`samples` NIAH prompts per variant and length), with `report.md`; `procs` training processes per run;
    `steps`: the lengths of stage 1 and stage 2 (default: the configs'); `lengths`: the evaluation's NIAH
    context lengths (default: the training length, 2x and 4x). A refused folder or a damaged base
    model raises `RepoError` before anything is written; an interrupted demo resumes where it stopped."""
    start = time.monotonic()
    batch = demo_config("stage1-rope").global_train_batch_size
    if batch % procs:  # the same batches whatever the processes
        raise RepoError(f"procs={procs} must divide the demo's batch of {batch} sequences")
    demo = _Demo(out.resolve(), base_dir, samples, procs, steps, batch, lengths)  # before the imports below
    from .base import base_tokenizer  # lm-eval, transformers: seconds

    try:  # the base model's files first: a damaged one stops the demo before anything is written
        require_model_dir(base_dir)
        tokenizer = base_tokenizer(base_dir)
    except (OSError, CorruptFileError) as e:
        raise CorruptFileError(
            f"{e} (the shipped base model: reinstall olmo-repo, or rebuild it with `make demo-base`)"
        ) from e
    demo.publish()  # a report built from records that other inputs made stale loses them now
    base = demo.base(base_dir)
    demo.corpus(tokenizer)
    results = [demo.train("stage1-rope", f"--load_path={base}")]
    results += [demo.train(name, f"--load_path={results[0].checkpoint}") for name in STAGE2.values()]
    trained = f"Trained in {time.monotonic() - start:.0f} s" if demo.ran & set(TRAINING) else "Trained before"
    print(f"\n{trained}. Losses are token cross-entropy (nats).\n")
    print(console_table(results), flush=True)
    figure = Path(CURVES)
    demo.run("curves", [], lambda resume: plot_curves(demo.path, demo.entry(figure.parent.name) / figure.name),
             demo.curves)  # fmt: skip
    models = {label: demo.convert(name) for label, name in STAGE2.items()}
    demo.run(
        "evaluation", [EVALUATION], lambda resume: demo.evaluate(models, resume), demo.sections, resumes=True
    )
    demo.publish()
    unchanged = "" if demo.written else " (unchanged)"
    print(
        f"\nDemo finished in {time.monotonic() - start:.0f} s. Report: {demo.path / 'report.md'}{unchanged}"
    )
    return results


class _Demo(Stages):
    """One `make demo` in its folder: every stage's inputs (known before any runs), the stages, and `report.md`
    assembled from what they recorded."""

    def __init__(
        self,
        path: Path,
        base_dir: Path,
        samples: int,
        procs: int,
        steps: tuple[int, int] | None,
        batch: int,
        lengths: tuple[int, ...] | None,
    ):
        super().__init__(path)
        self.samples, self.procs, self.lengths, self.written = samples, procs, lengths, False
        lengths_ = [(f"--max_duration={n}", f"--stop_at={n}") for n in steps] if steps else [(), ()]
        common = (f"--data_prefix={path / 'data'}", f"--device_train_microbatch_size={batch // procs}")
        self.overrides = {"stage1-rope": (*common, "--reset_optimizer_state=true", *lengths_[0])}
        self.overrides.update({name: (*common, *lengths_[1]) for name in STAGE2.values()})
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
            overrides = [o.replace(str(path), "$OUT") for o in self.overrides[name]]
            inputs[name] = digest(inputs[upstream], config_path(name).read_bytes(), *overrides)
        inputs["curves"] = digest(*(inputs[name] for name in STAGE2.values()))
        inputs.update({f"{name}-hf": inputs[name] for name in STAGE2.values()})
        # the default lengths as before the option, so that a finished demo stays finished
        inputs["evaluation"] = digest(inputs["curves"], str(samples), *([str(lengths)] if lengths else []))
        self.inputs = inputs

    def base(self, base_dir: Path) -> Path:
        """The HF base model `base_dir` as an unsharded OLMo checkpoint at step 0, without optimizer state."""
        base = self.path / "base"

        def work(resume: bool) -> None:
            from ...ai2olmo.hf import convert_from_hf

            convert_from_hf(base_dir, self.entry("base"), force=True)
            print(f"Base model {base_dir} -> {base}", flush=True)

        return self.run("base", ["base"], work, lambda: _model(base))

    def corpus(self, tokenizer: Any) -> None:
        """The corpus, tokenized with the base model's `tokenizer`."""
        from .corpus import build_corpus, check_corpus

        data = self.path / "data"

        def work(resume: bool) -> None:
            print(f"Building the corpus under {data}...", flush=True)
            paths = build_corpus(self.entry("data"), tokenizer, self.windows)
            sizes = [f"{k} {p.stat().st_size // 4:,} tokens" for k, p in paths.items() if p.suffix == ".npy"]
            print(f"   {', '.join(sizes)}", flush=True)

        self.run("corpus", ["data"], work, lambda: check_corpus(data, self.windows))

    def train(self, name: str, load_path: str) -> RunResult:
        """Training run `name` from `load_path`; a start that was interrupted resumes from its latest checkpoint."""

        def work(resume: bool) -> dict[str, float | str]:
            self.entry(f"{name}.log")  # run_training writes the full log beside the run
            save = self.entry(name)
            overrides = (*self.overrides[name], load_path)
            wall = run_training(name, config_path(name), save, *overrides, procs=self.procs)
            # the checkpoint by its name in the run's folder: the demo folder may move
            return {"wall_s": wall, "checkpoint": latest_checkpoint(name, save).name}

        return self.run(name, [name, f"{name}.log"], work, lambda: self.training_run(name), resumes=True)

    def training_run(self, name: str) -> RunResult:
        """Training run `name`, read back from its metrics.jsonl, with its latest checkpoint."""
        result = self.summary(name)
        require_model_dir(result.checkpoint)
        return result

    def summary(self, name: str) -> RunResult:
        """Training run `name`'s row of the report, from its metrics.jsonl."""
        record, save = self.record(name), self.path / name
        return summarise(name, save, record["wall_s"], save / record["checkpoint"])

    def convert(self, name: str) -> Path:
        """The HF conversion of training run `name`."""
        hf = self.path / f"{name}-hf"

        def work(resume: bool) -> None:
            from ...ai2olmo.hf import convert_to_hf

            convert_to_hf(self.training_run(name).checkpoint, self.entry(hf.name), force=True)

        return self.run(hf.name, [hf.name], work, lambda: _model(hf))

    def curves(self) -> str:
        """The in-loop NIAH section: from the stage-2 runs' metrics.jsonl, with its figure."""
        return require_figures(self.path, curves_section(self.path))

    def sections(self) -> list[str]:
        """The evaluation's sections, as it recorded them, with their figures."""
        return [require_figures(self.path, s) for s in self.sections_text()]

    def sections_text(self) -> list[str]:
        """The evaluation's sections, as it recorded them."""
        sections = json.loads((self.path / EVALUATION).read_text())
        if not isinstance(sections, list) or not all(isinstance(s, str) for s in sections):
            raise ValueError(f"{self.path / EVALUATION} is not a list of Markdown sections")
        return sections

    def evaluate(self, models: dict[str, Path], resume: bool) -> None:
        """Evaluate `models` ({label: HF directory}) section by section, each recorded and published as it is
        ready. An interrupted evaluation (the same inputs: the same results) resumes after the sections it
        recorded whose figures are intact."""
        from ...eval.report import report_sections
        from ...upstream import lm_eval
        from .corpus import BATCH, SEQ_LEN

        print("\nEvaluating the stage-2 models for the report...", flush=True)
        lm_eval.quiet()  # lm-eval's per-task notes are noise here; its errors still show
        sections = self._intact_sections() if resume else []
        if sections:
            print(f"   {len(sections)} section(s) recorded before, kept", flush=True)
        tokens = self.training_run(STAGE2["RoPE"]).steps * BATCH * SEQ_LEN  # stage 2 counts its steps from 0
        figures = self.entry("figures")
        self.write_text(EVALUATION, json.dumps(sections, indent=1))
        for section in report_sections(
            models,
            figures,
            groups=niah_groups(),
            samples=self.samples,
            tokens=tokens,
            lengths=self.lengths,
            done=len(sections),
        ):
            sections.append(section)
            self.write_text(EVALUATION, json.dumps(sections, indent=1))
            self.publish()

    def _intact_sections(self) -> list[str]:
        """The sections an interrupted evaluation with the current inputs recorded, up to the first whose
        record or figures cannot be read."""
        kept: list[str] = []
        for section in self.recorded("evaluation", self.sections_text, partial=True) or []:
            try:
                kept.append(require_figures(self.path, section))
            except UNREADABLE:
                break
        return kept

    def publish(self) -> None:
        """Rewrite report.md from the records of the stages that finished with their current inputs (the
        evaluation's also while it runs), if that changes it. A section whose figure or checkpoint is lost
        stays: its stage is redone with the same inputs."""
        runs = [r for name in TRAINING if (r := self.recorded(name, lambda name=name: self.summary(name)))]
        if not runs:
            return
        curves = self.recorded("curves", lambda: curves_section(self.path)) or ""
        evaluation = self.recorded("evaluation", self.sections_text, partial=True) or []
        text = "\n".join(s.rstrip() + "\n" for s in [preamble(runs), curves, *evaluation] if s)
        self.written |= self.write_text("report.md", text)


def _in_loop_prompts(name: str, samples: int) -> tuple[str, ...]:
    """The override of run `name`'s evaluators (the whole list: overrides replace lists) that gives its in-loop
    NIAH entries `samples` prompts each, or none where its config has that number already (the shipped
    configs have `SAMPLES`)."""
    entries = OmegaConf.to_container(demo_config(name).get("evaluators") or [], resolve=False)
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
