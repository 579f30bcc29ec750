"""`make demo`: a tiny RePo continual pre-training on CPU, offline, through `scripts/train.py`, and a report.

1. Builds a corpus in OLMo's memmap format (uint32 token ids in 512-token windows, documents separated by
   <|endoftext|>) with the shipped base model's 4,096-token BPE (dolma2's pre-tokenizer): RULER NIAH documents
   (prompt and answer, from the generator the evaluation uses, with other seeds), short retrieval practice,
   stories (`olmo_repo.demo_corpus`).
2. Converts the shipped tiny base model (`olmo_repo/demo_base/`, HF, the analogue of a pre-trained OLMo-2
   checkpoint; `olmo_repo.demo_base` says why and how it was built) to an OLMo checkpoint and continues it
   with RoPE on the corpus ("stage 1", `configs/tiny-stage1-rope.yaml`, a fresh optimizer).
3. Continues it with RePo and with plain RoPE ("stage 2", `configs/tiny-stage2-{repo,rope}.yaml`), both from
   the stage-1 checkpoint with its optimizer state, as the released recipe does; prints a table (steps,
   losses, tokens/s, wall time, the range of the positions of every RePo layer, checkpoints).
4. Converts both stage-2 models to HF and writes `report.md` (`olmo_repo.eval.report`): NIAH at 512, 1024 and
   2048 tokens (YaRN x2, x4), attention mass, learned positions, training FLOPs.

Everything goes into one folder (`DemoFolder`): a new or empty one, or a previous demo's, whose outputs are
replaced while anything else in it stays. A non-empty folder that no demo wrote is refused before any work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from olmo.exceptions import OLMoCheckpointError
from olmo.util import find_latest_checkpoint

from .tables import markdown_table

__all__ = ["DemoFolder", "RunResult", "run_demo", "run_training"]

ROOT = Path(__file__).resolve().parents[1]


class DemoFolder:
    """The demo's output folder. Every entry the demo writes is named through `entry()` and listed in a
    marker file, so that a rerun removes exactly the previous demo's outputs and nothing a user put there."""

    MARKER = ".olmo-repo-demo"
    # What demos wrote before the marker existed: such a folder is a previous demo's too.
    UNMARKED = {
        "data",
        "stage1-rope",
        "stage2-repo",
        "stage2-rope",
        "stage1-rope.log",
        "stage2-repo.log",
        "stage2-rope.log",
    }

    def __init__(self, path: Path):
        self.path, marker = path, path / self.MARKER
        if path.exists() and not path.is_dir():
            sys.exit(f"{path} is a file: pass a folder for the demo's outputs")
        present = {p.name for p in path.iterdir()} if path.is_dir() else set()
        if marker.is_file():
            self.entries: list[str] = json.loads(marker.read_text())
        elif present <= self.UNMARKED:
            self.entries = sorted(present)
        else:
            sys.exit(
                f"{path} is not empty and not a previous demo's folder: pass a new or empty folder (the demo "
                "writes its corpus and runs there)"
            )

    def clear(self) -> None:
        """Remove what a previous demo wrote here; everything else in the folder stays."""
        for name in self.entries:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        self.entries = []
        self._save()

    def entry(self, name: str) -> Path:
        """`path / name`, recorded as the demo's before anything is written to it."""
        if name not in self.entries:
            self.entries.append(name)
            self._save()
        return self.path / name

    def _save(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / self.MARKER).write_text(json.dumps(self.entries))


@dataclass
class RunResult:
    name: str
    steps: int
    first_loss: float
    last_loss: float
    eval_loss: float | None
    tokens_per_s: float | None
    wall_s: float
    checkpoint: str
    positions: str  # [min,max] of the predicted positions of every RePo layer at the last step, or "-"


_STEP = re.compile(r"\[step=(\d+)/(\d+)")
_POSITIONS = "train/positions/"


def run_training(name: str, config: str, save_folder: Path, *overrides: str) -> RunResult:
    """Run `scripts/train.py config` in a subprocess, print one progress line per step, summarise the run."""
    cmd = [sys.executable, str(ROOT / "scripts/train.py"), str(ROOT / config), f"--save_folder={save_folder}"]
    cmd += list(overrides)
    env = {**os.environ, "OLMo_NONINTERACTIVE": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    log_path = save_folder.parent / f"{name}.log"
    print(f"\n== {name}: {' '.join(cmd[1:])}\n   (full log: {log_path})", flush=True)
    start = time.monotonic()
    step = ""
    with (
        open(log_path, "w") as log_file,
        subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            if m := _STEP.search(line):
                step = f"{m.group(1)}/{m.group(2)}"
            elif "train/CrossEntropyLoss=" in line and step:
                loss = line.split("=", 1)[1].strip()
                print(f"   {name} step {step:>7}  loss {loss}", flush=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{name} failed (exit {proc.returncode}); see {log_path}")

    records = [json.loads(line) for line in open(save_folder / "metrics.jsonl")]
    train = [r for r in records if "train/CrossEntropyLoss" in r]
    evals = [r[k] for r in records for k in r if k.startswith("eval/") and k.endswith("CrossEntropyLoss")]
    speeds = [
        r["throughput/device/tokens_per_second"] for r in train if "throughput/device/tokens_per_second" in r
    ]
    return RunResult(
        name=name,
        steps=train[-1]["step"],
        first_loss=train[0]["train/CrossEntropyLoss"],
        last_loss=train[-1]["train/CrossEntropyLoss"],
        eval_loss=evals[-1] if evals else None,
        tokens_per_s=float(np.median(speeds)) if speeds else None,
        wall_s=wall,
        checkpoint=str(find_latest_checkpoint(save_folder)),
        positions=positions_summary(train[-1]),
    )


def positions_summary(metrics: dict[str, float]) -> str:
    """`layer:[min,max]` of every RePo layer in a metrics record (`train/positions/layer{i}/...`), or "-"."""
    layers = sorted({int(k.split("/")[2].removeprefix("layer")) for k in metrics if k.startswith(_POSITIONS)})
    spans = []
    for i in layers:
        lo, hi = metrics[f"{_POSITIONS}layer{i}/min"], metrics[f"{_POSITIONS}layer{i}/max"]
        spans.append(f"{i}:[{lo:.2g},{hi:.2g}]")
    return " ".join(spans) or "-"


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


def _train(folder: DemoFolder, name: str, config: str, *overrides: str) -> RunResult:
    folder.entry(f"{name}.log")  # run_training writes the full log beside the run
    return run_training(name, config, folder.entry(name), *overrides)


def run_demo(out: Path = ROOT / "runs/demo", samples: int = 20) -> list[RunResult]:
    """The whole demo under `out` (see `DemoFolder`): corpus, stage 1, stage 2 with RePo and with RoPE, and the
    report (`samples` NIAH prompts per variant and length)."""
    start = time.monotonic()
    folder = DemoFolder(out)  # before the imports below (lm-eval, transformers: seconds): a refusal is quick
    from .demo_base import BASE_DIR, base_tokenizer
    from .demo_corpus import BATCH, SEQ_LEN, build_corpus
    from .eval.report import write_report
    from .hf.convert import convert_from_hf, convert_to_hf

    folder.clear()
    tokenizer = base_tokenizer()
    try:  # an unsharded checkpoint at step 0, without optimizer state; written only once complete
        base = convert_from_hf(BASE_DIR, folder.entry("base"))
    except (OSError, OLMoCheckpointError) as e:
        sys.exit(f"{e} (the shipped base model: reinstall olmo-repo, or rebuild it with `make demo-base`)")
    print(f"Base model {BASE_DIR} -> {base}", flush=True)
    data_dir = folder.entry("data")
    print(f"Building the corpus under {data_dir}...", flush=True)
    paths = build_corpus(data_dir, tokenizer)
    sizes = ", ".join(f"{k} {p.stat().st_size // 4:,} tokens" for k, p in paths.items() if p.suffix == ".npy")
    print(f"   {sizes}", flush=True)
    data = f"--data_prefix={data_dir}"
    init = (f"--load_path={base}", "--reset_optimizer_state=true")
    stage1 = _train(folder, "stage1-rope", "configs/tiny-stage1-rope.yaml", data, *init)
    load = f"--load_path={stage1.checkpoint}"
    results = [stage1]
    for variant in ("repo", "rope"):
        results.append(_train(folder, f"stage2-{variant}", f"configs/tiny-stage2-{variant}.yaml", data, load))
    print(f"\nTrained in {time.monotonic() - start:.0f} s. Losses are token cross-entropy (nats).\n")
    print(_table(results), flush=True)

    print("\nEvaluating the stage-2 models for the report...", flush=True)
    # As scripts/eval.py: lm-eval's per-task notes are noise here; its errors still show.
    from ..upstream import lm_eval

    lm_eval.quiet()
    models = {
        label: convert_to_hf(r.checkpoint, folder.entry(f"{r.name}-hf"))
        for label, r in zip(("RePo", "RoPE"), results[1:])
    }
    folder.entry("figures")
    report = write_report(
        folder.entry("report.md"),
        models,
        title="`make demo`: tiny RePo against RoPE",
        preamble=_preamble(results),
        samples=samples,
        tokens=results[1].steps * BATCH * SEQ_LEN,
    )
    print(f"\nDemo finished in {time.monotonic() - start:.0f} s. Report: {report}", flush=True)
    return results


def _preamble(results: list[RunResult]) -> str:
    from .demo_corpus import NIAH_VARIANTS, SEQ_LEN, VOCAB

    return (
        f"A tiny OLMo-2-shaped model (d_model 128, 4 layers, tied embeddings, {SEQ_LEN}-token context, "
        f"{VOCAB:,}-token BPE): the shipped base model (`olmo_repo/demo_base/`, 4,000 steps of RoPE "
        f"pre-training, built by `make demo-base`) continued with RoPE (stage 1), then continued from that "
        f"checkpoint with RePo on layers 1-3 and, for comparison, with RoPE (stage 2), on a generated corpus "
        f"with RULER NIAH documents "
        f"({', '.join(NIAH_VARIANTS)}; seeds the evaluation does not use), short retrieval practice and "
        f"stories. Evaluated as Hugging Face models (`scripts/convert_to_hf.py`).\n\n## Training\n\n"
        f"{markdown_table(_HEADER, _rows(results))}\n\nLosses are token cross-entropy (nats).\n"
    )
