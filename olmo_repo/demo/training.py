"""One training run of the demo: `python -m olmo_repo.cli.train CONFIG` in a subprocess, its console in a log
file, a progress line per logged step and a summary, both read from the run's `metrics.jsonl`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from olmo.util import find_latest_checkpoint
from omegaconf import OmegaConf

from ..errors import RepoError
from ..modes import POSITIONS_METRIC
from ..train.trainer import METRICS_FILE

__all__ = ["RunResult", "positions_summary", "read_metrics", "run_training"]

LOSS = "train/CrossEntropyLoss"
SPEED = "throughput/device/tokens_per_second"


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


def run_training(name: str, config: Path, save_folder: Path, *overrides: str) -> RunResult:
    """Train `config` (with `--key=value` overrides) into `save_folder` in a subprocess, its console output in
    `save_folder.parent / f"{name}.log"`; print one progress line per logged step; summarise the run. A run
    that fails raises `RepoError` naming the log."""
    cmd = [
        sys.executable,
        "-m",
        "olmo_repo.cli.train",
        str(config),
        f"--save_folder={save_folder}",
        *overrides,
    ]
    env = {**os.environ, "OLMo_NONINTERACTIVE": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    log_path = save_folder.parent / f"{name}.log"
    metrics_path = save_folder / METRICS_FILE
    print(f"\n== {name}: {' '.join(cmd[1:])}\n   (full log: {log_path})", flush=True)
    start = time.monotonic()
    progress = _Progress(name, metrics_path)
    with (
        open(log_path, "w") as log_file,
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        assert proc.stdout is not None
        for (
            line
        ) in proc.stdout:  # the console only paces the progress lines: their numbers are metrics.jsonl's
            log_file.write(line)
            progress.update()
    progress.update()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RepoError(f"{name} failed (exit {proc.returncode}); see {log_path}")

    records = read_metrics(metrics_path)
    train = [r for r in records if LOSS in r]
    if not train:
        raise RepoError(f"{name} logged no training step in {metrics_path}; see {log_path}")
    evals = [r[k] for r in records for k in r if k.startswith("eval/") and k.endswith("CrossEntropyLoss")]
    speeds = [r[SPEED] for r in train if SPEED in r]
    return RunResult(
        name=name,
        steps=train[-1]["step"],
        first_loss=train[0][LOSS],
        last_loss=train[-1][LOSS],
        eval_loss=evals[-1] if evals else None,
        tokens_per_s=float(np.median(speeds)) if speeds else None,
        wall_s=wall,
        checkpoint=str(find_latest_checkpoint(save_folder)),
        positions=positions_summary(train[-1]),
    )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl: one per logged step (training and evaluation)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


class _Progress:
    """Prints `name step N/MAX  loss L` for every training record that metrics.jsonl gains."""

    def __init__(self, name: str, metrics_path: Path):
        self.name, self.path, self.read = name, metrics_path, 0
        self.of: str | None = None  # "/MAX", from the run's config.yaml (written before its first step)

    def update(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self.read)
            new = f.read()
        new = new[: new.rfind(b"\n") + 1]  # a line being written is read once complete
        self.read += len(new)
        for record in map(json.loads, new.splitlines()):
            if LOSS in record:
                if self.of is None:
                    duration = OmegaConf.load(self.path.parent / "config.yaml").get("max_duration")
                    self.of = f"/{duration}" if isinstance(duration, int) else ""
                step = f"{record['step']}{self.of}"
                print(f"   {self.name} step {step:>7}  loss {record[LOSS]:.3f}", flush=True)


_MIN_KEY = re.compile(re.escape(POSITIONS_METRIC).replace(r"\{layer\}", r"(\d+)").replace(r"\{stat\}", "min"))


def positions_summary(metrics: dict[str, float]) -> str:
    """`layer:[min,max]` of every RePo layer in a metrics record (keys `POSITIONS_METRIC`), or "-"."""
    layers = sorted(int(m[1]) for k in metrics if (m := _MIN_KEY.fullmatch(k)))
    spans = []
    for i in layers:
        lo, hi = (metrics[POSITIONS_METRIC.format(layer=i, stat=stat)] for stat in ("min", "max"))
        spans.append(f"{i}:[{lo:.2g},{hi:.2g}]")
    return " ".join(spans) or "-"
