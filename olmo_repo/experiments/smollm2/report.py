"""The SmolLM2 recipe's report: report.md from what its stages recorded (`RecipeReport.publish`, after each stage),
with the loss curves and a plain statement of what the figures do and do not show at this scale."""

from __future__ import annotations

import json
from pathlib import Path

from ...metrics import METRICS_FILE, read_metrics
from ...tables import markdown_table
from ..stages import Stages
from .options import Arm, Recipe, RunConfig, run_config

__all__ = ["LOSS", "TAIL", "RecipeReport"]

LOSS = "train/CE loss"
TAIL = 10  # the training table's loss is the mean of the last TAIL steps' (one batch's is noisy)


class RecipeReport(Stages):
    """The recipe's folder, what its arms' configs say and which models its stages make, and its report."""

    def __init__(self, path: Path, recipe: Recipe):
        super().__init__(path, "recipe", "its model, data, runs and report")
        self.recipe = recipe
        self.model_dir = Path(recipe.model) if recipe.model else path / "smollm2-135m"

    def arm_config(self, arm: Arm) -> RunConfig:
        """What the config says of `arm`'s run."""
        return run_config(arm)

    def config(self) -> RunConfig:
        """What the config says of every arm's run alike (its batches, windows and optimizer)."""
        return run_config()

    def publish(self) -> None:
        """report.md from what the stages recorded (rewritten only if it changes)."""
        parts = [f"# SmolLM2-135M continued with RePo, at CPU scale\n\n{self._setup()}"]
        if (training := self._training()) is not None:
            parts.append(training)
        if self.finished("evaluation") or (self.path / "evaluation.json").is_file():
            parts += self.sections()
        parts.append(self._limits())
        self.write_text("report.md", "\n".join(p.rstrip() + "\n" for p in parts))

    def _setup(self) -> str:
        r, c, data = self.recipe, self.config(), self.record("data") or {}
        train, held = data.get("train_tokens"), data.get("heldout_tokens")
        if not held:
            return "SmolLM2-135M-Instruct, Q4_1 dequantised, continued in several arms (running...).\n"
        arms = "\n".join(
            f"- **{arm.label}**: "
            + (", ".join(f"`{key}={value}`" for key, value in arm.overrides) or "the config as it is")
            for arm in r.arms
        )
        return (
            "SmolLM2-135M-Instruct, Q4_1 dequantised (`scripts/smollm2.py`: not the released weights), continued "
            f"on OLMo-core for {r.steps} steps of {c.windows} x {c.window} tokens ({r.steps * c.windows * c.window:,} "
            f"tokens per run) on {r.procs} CPU process{'es' * (r.procs > 1)}, once per arm from the same start, "
            f"on the same batches. The recipe is `configs/olmocore/smollm2-repo.py`: RePo in layers "
            f"{c.layers} (f_phi new, the recipe's init), the paper's OLMo 2 1B stage-2 learning rate "
            f"{f'{c.lr:g}'.replace('e-0', 'e-')}, {c.schedule}, AdamW {c.betas}, weight decay {c.weight_decay:g}; "
            "each arm is these overrides of it:\n\n"
            f"{arms}\n\nData: Python's own documentation (`pydoc_data.topics`) in SmolLM2's tokens, {train:,} "
            f"tokens for training; the last {r.heldout_topics} topics by name ({held:,} tokens) held out.\n"
        )

    def _training(self) -> str | None:
        held = self.record("heldout") if self.finished("heldout") else None  # not one under way
        curves = {
            arm.label: self.curve(arm.name) for arm in self.recipe.arms if self.finished(f"train-{arm.name}")
        }
        if not curves:
            return None
        text, c = "## Insertion cost and training\n\n", self.config()
        losses = json.loads(held["losses"]) if held else None
        if losses:
            stock = losses["stock"]
            rows = [[name, f"{loss:.4f}", f"{loss - stock:+.4f}"] for name, loss in losses.items()]
            text += (
                f"Held-out loss (nats per token; windows of {c.window} tokens of the held-out topics, every token "
                "after the first of each window). An arm whose blend starts at 1 is the stock model at step 0 "
                "(bit for bit); `index` and `constant`: the arm's RePo layers rotating by the token index (as "
                "RoPE) or by one constant position (as NoPE), how much its learned positions matter.\n\n"
                + markdown_table(["model", "held-out loss", "vs stock"], rows)
                + "\n\n"
                + self._reading(losses)
                + "\n\n"
            )
        rows = []
        for arm in self.recipe.arms:
            if arm.label not in curves:
                continue
            curve, record = curves[arm.label], self.record(f"train-{arm.name}") or {}
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
        text += f"![loss curves]({figure.relative_to(self.path)})\n"
        return text + (self._positions(json.loads(held["positions"])) if held else "")

    def _positions(self, positions: dict[str, dict[str, dict[str, float]]]) -> str:
        """The RePo arms' positions on the held-out windows, per arm over its layers (`positions.spread`)."""
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
            "\nWhere the RePo arms put the held-out tokens, over their RePo layers (`positions.spread`: the trainers log "
            "the same per layer): the mean spread of a layer's positions, its 5th-95th percentile width, the "
            "extremes, and Spearman's rank correlation with the token index (1: in the tokens' order, as RoPE; "
            "0: unrelated).\n\n"
            + markdown_table(
                ["arm", "std", "p95 - p05", "min, max", "rank corr", "layers with rank corr > 0.5"], rows
            )
            + "\n"
        )

    def _loss_figure(self, curves: dict[str, dict[int, float]], losses: dict[str, float] | None) -> Path:
        from ...eval.plots import plot_loss_curves

        points = None
        if losses:
            steps = self.recipe.steps
            points = {
                arm.label: {0: losses[self.start_of(arm)], steps: losses[f"{arm.label}, step {steps}"]}
                for arm in self.recipe.arms
                if arm.label in curves
            }
        figure = self.entry("figures") / "loss.png"
        drawn = plot_loss_curves(
            curves, figure.with_name(".loss.png.partial"), points=points,
            baseline=losses["stock"] if losses else None,
            title=f"SmolLM2-135M: layers {self.config().layers} as each arm has them",
        )  # fmt: skip
        if figure.is_file() and figure.read_bytes() == drawn.read_bytes():
            drawn.unlink()  # the same figure: left as it was, like report.md
        else:
            drawn.replace(figure)
        return figure

    def _limits(self) -> str:
        r, c = self.recipe, self.config()
        return (
            "## What this shows, and what it does not\n\n"
            f"- It is a real measurement on a real pretrained model: its weights, tokenizer and English text, "
            "through the project's whole pipeline (conversion, stage-1 start, OLMo-core training on 2 processes, "
            "conversion back, transformers' generation).\n"
            f"- Each run sees {r.steps * c.windows * c.window:,} tokens, some 10^5 times fewer than the paper's 50B, in "
            f"windows of {c.window} tokens, far shorter than the 1K-4K contexts NIAH asks about: nothing here can "
            f"show the paper's long-context gains, and each NIAH cell holds {r.samples} "
            f"prompt{'s' * (r.samples != 1)} (see their intervals).\n"
            f"- A fresh f_phi predicts positions near 0, so with the paper's settings layers {c.layers} start as NoPE "
            "and, at its learning rate, stay there for a run this short (Adam moves a weight by about lr a "
            "step): a large insertion cost these few steps do not recover is the expected outcome, not a fault. "
            "An arm whose blend starts at 1 starts as the stock model instead, and a larger learning rate of "
            "f_phi's own lets its positions move; the RoPE arm is the control for what the same steps do to the "
            "stock model (a small model fine-tuned on one narrow text).\n"
            "- The learned positions show what f_phi learned in these steps, not what it learns in the paper's "
            "run.\n"
        )

    def step0_arms(self) -> dict[str, Arm]:
        """{mode: the first arm of it} of the modes whose step 0 is not the stock model (RePo and NoPE without
        a blend: f_phi's init is the same in every arm, so one step 0 stands for all of a mode)."""
        arms: dict[str, Arm] = {}
        for arm in self.recipe.arms:
            if (c := self.arm_config(arm)).mode != "rope" and not c.blended:
                arms.setdefault(c.mode, arm)
        return arms

    def start_of(self, arm: Arm) -> str:
        """The held-out loss's name of `arm`'s step 0."""
        c = self.arm_config(arm)
        first = self.step0_arms().get(c.mode)
        return "stock" if c.mode == "rope" or c.blended or first is None else f"{first.label}, step 0"

    def models(self, step0: bool) -> dict[str, Path]:
        """stock, the step 0 of each mode that does not start as stock (`step0`), then every arm at the end."""
        path, steps = self.path, self.recipe.steps
        models = {"stock": self.model_dir}
        if step0:
            models |= {
                f"{arm.label}, step 0": path / f"hf-{mode}-step0" for mode, arm in self.step0_arms().items()
            }
        return models | {f"{arm.label}, step {steps}": path / f"hf-{arm.name}" for arm in self.recipe.arms}

    def _last_positions(self, arm: Arm) -> tuple[str, str]:
        """The mean over layers of the in-loop positions' std and rank correlation at the arm's last step."""
        if self.arm_config(arm).mode != "repo":
            return "", ""
        records = read_metrics(self.path / f"run-{arm.name}" / METRICS_FILE)
        last = next((r for r in reversed(records) if any(k.endswith("/rank_corr") for k in r)), {})
        stats = {stat: [v for k, v in last.items() if k.startswith("train/positions/layer") and k.endswith(f"/{stat}")]
                 for stat in ("std", "rank_corr")}  # fmt: skip
        if not stats["std"]:
            return "", ""
        return (
            f"{sum(stats['std']) / len(stats['std']):.3g}",
            f"{sum(stats['rank_corr']) / len(stats['rank_corr']):+.2f}",
        )

    def curve(self, name: str) -> dict[int, float]:
        """Arm `name`'s training loss by step, from its metrics.jsonl."""
        records = read_metrics(self.path / f"run-{name}" / METRICS_FILE)
        return {r["step"]: r[LOSS] for r in records if LOSS in r}

    def sections(self) -> list[str]:
        """The evaluation's sections, as far as it recorded them."""
        path = self.path / "evaluation.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def finished(self, stage: str) -> bool:
        """Whether stage `stage` finished (with whatever inputs: the report shows what the folder holds)."""
        return bool((self.record(stage) or {}).get("done"))

    def _reading(self, losses: dict[str, float]) -> str:
        """Plain sentences on the held-out losses: each arm's insertion cost, how much of it its steps
        recovered, and what the RoPE control's steps did."""
        stock, lines, steps = losses["stock"], [], self.recipe.steps
        for arm in self.recipe.arms:
            start_name = self.start_of(arm)
            if (end := losses.get(f"{arm.label}, step {steps}")) is None:
                continue
            start = losses[start_name]
            cost = start - stock
            if self.arm_config(arm).mode == "rope":
                lines.append(
                    f"The RoPE control, the same steps on the stock model, moves {end - stock:+.3f}."
                )
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
