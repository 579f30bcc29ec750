"""One training run of the demo: `python -m olmo_repo.cli.train CONFIG` in a subprocess (or under torchrun),
its console in a log file, a progress line per logged step and a summary, both read from the run's
`metrics.jsonl`."""

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

__all__ = ["RunResult", "niah_curves", "positions_summary", "read_metrics", "run_training", "summarise"]

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


def run_training(name: str, config: Path, save_folder: Path, *overrides: str, procs: int = 1) -> float:
    """Train `config` (with `--key=value` overrides) into `save_folder` in a subprocess, resuming what a previous
    start left there; append its console output to `save_folder.parent / f"{name}.log"`; print a progress line
    per logged step (with an ETA) and per in-loop NIAH evaluation. Returns the wall time in seconds. A run that
    fails raises `RepoError` naming the log.

    procs > 1: `procs` DDP processes of one thread each (torchrun's layout, which keeps its speed when other
    work shares the cores); procs == 1: one process with torch's default threads."""
    launcher = [sys.executable, "-m"]
    env = {**os.environ, "OLMo_NONINTERACTIVE": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    if procs > 1:
        launcher += ["torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", "-m"]
        env["OMP_NUM_THREADS"] = "1"
    cmd = [*launcher, "olmo_repo.cli.train", str(config), f"--save_folder={save_folder}", *overrides]
    log_path = save_folder.parent / f"{name}.log"
    metrics_path = save_folder / METRICS_FILE
    print(f"\n== {name}: {' '.join(cmd[1:])}\n   (full log: {log_path})", flush=True)
    start = time.monotonic()
    progress = _Progress(name, metrics_path)
    with (
        open(log_path, "a") as log_file,
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        assert proc.stdout is not None
        for (
            line
        ) in proc.stdout:  # the console only paces the progress lines: their numbers are metrics.jsonl's
            log_file.write(line)
            progress.update()
    progress.update()
    if proc.returncode != 0:
        raise RepoError(f"{name} failed (exit {proc.returncode}); see {log_path}")
    return time.monotonic() - start


def summarise(name: str, save_folder: Path, wall_s: float) -> RunResult:
    """The run in `save_folder`, from its metrics.jsonl and checkpoints."""
    metrics_path = save_folder / METRICS_FILE
    records = read_metrics(metrics_path) if metrics_path.is_file() else []
    train = [r for r in records if LOSS in r]
    if not train:
        raise RepoError(f"{name} logged no training step in {metrics_path}")
    evals = [r[k] for r in records for k in r if k.startswith("eval/") and k.endswith("CrossEntropyLoss")]
    speeds = [r[SPEED] for r in train if SPEED in r]
    if (checkpoint := find_latest_checkpoint(save_folder)) is None:
        raise RepoError(f"{name} saved no checkpoint in {save_folder}")
    return RunResult(
        name=name,
        steps=train[-1]["step"],
        first_loss=train[0][LOSS],
        last_loss=train[-1][LOSS],
        eval_loss=evals[-1] if evals else None,
        tokens_per_s=float(np.median(speeds)) if speeds else None,
        wall_s=wall_s,
        checkpoint=str(checkpoint),
        positions=positions_summary(train[-1]),
    )


def niah_curves(save_folder: Path) -> dict[int, dict[str, float]]:
    """{step: {variant: exact match}} of the in-loop NIAH evaluations in a run's metrics.jsonl."""
    curves: dict[int, dict[str, float]] = {}
    for record in read_metrics(save_folder / METRICS_FILE):
        for key, value in record.items():
            if (m := _NIAH_KEY.fullmatch(key)) is not None:
                curves.setdefault(record["step"], {})[m[1]] = value
    return curves


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl: one per logged step (training and evaluation)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


class _Progress:
    """Prints `name step N/MAX  loss L  ETA` for every training record that metrics.jsonl gains, and the mean
    in-loop NIAH exact match of every evaluation step once all its variants are in."""

    def __init__(self, name: str, metrics_path: Path):
        self.name, self.path, self.read = name, metrics_path, 0
        self.max_steps: int | None = None  # from the run's config.yaml (written before its first step)
        self.first: tuple[int, float] | None = None  # (step, time) of the first step seen by this start
        self.niah: dict[int, dict[str, float]] = {}
        self.variants = 0

    def update(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self.read)
            new = f.read()
        new = new[: new.rfind(b"\n") + 1]  # a line being written is read once complete
        self.read += len(new)
        for record in map(json.loads, new.splitlines()):
            self._niah(record)
            if LOSS in record:
                self._step(record)

    def _read_config(self) -> None:
        if self.max_steps is None:
            config = OmegaConf.load(self.path.parent / "config.yaml")
            duration = config.get("max_duration")
            self.max_steps = duration if isinstance(duration, int) else 0
            self.variants = sum(
                str(e.get("label", "")).startswith("niah_") for e in config.get("evaluators", [])
            )

    def _step(self, record: dict[str, Any]) -> None:
        self._read_config()
        step, now = record["step"], time.monotonic()
        self.first = self.first or (step, now)
        eta = ""
        if self.max_steps and step > self.first[0]:
            left = (self.max_steps - step) * (now - self.first[1]) / (step - self.first[0])
            eta = f"  ETA {int(left // 60)}m{int(left % 60):02d}s"
        of = f"/{self.max_steps}" if self.max_steps else ""
        print(f"   {self.name} step {f'{step}{of}':>7}  loss {record[LOSS]:.3f}{eta}", flush=True)

    def _niah(self, record: dict[str, Any]) -> None:
        scores = {m[1]: v for k, v in record.items() if (m := _NIAH_KEY.fullmatch(k))}
        if not scores:
            return
        self._read_config()
        at = self.niah.setdefault(record["step"], {})
        at.update(scores)
        if self.variants and len(at) == self.variants:
            mean = 100 * sum(at.values()) / len(at)
            print(
                f"   {self.name} step {record['step']:>7}  in-loop NIAH exact match {mean:.0f}% "
                f"(mean of {len(at)} variants)",
                flush=True,
            )


_NIAH_KEY = re.compile(r"eval/(niah_\w+)/exact_match")
_MIN_KEY = re.compile(re.escape(POSITIONS_METRIC).replace(r"\{layer\}", r"(\d+)").replace(r"\{stat\}", "min"))


def positions_summary(metrics: dict[str, float]) -> str:
    """`layer:[min,max]` of every RePo layer in a metrics record (keys `POSITIONS_METRIC`), or "-"."""
    layers = sorted(int(m[1]) for k in metrics if (m := _MIN_KEY.fullmatch(k)))
    spans = []
    for i in layers:
        lo, hi = (metrics[POSITIONS_METRIC.format(layer=i, stat=stat)] for stat in ("min", "max"))
        spans.append(f"{i}:[{lo:.2g},{hi:.2g}]")
    return " ".join(spans) or "-"
