"""One training run of the demo: `python -m olmo_repo.cli.train CONFIG` in a subprocess (or under torchrun),
its console in a log file, a progress line per logged step and a summary, both read from the run's
`metrics.jsonl`."""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ...errors import RepoError
from ...metrics import METRICS_FILE, metric_name, read_metrics
from ...modes import POSITIONS_METRIC, repo_layer_ids

__all__ = [
    "RunResult",
    "latest_checkpoint",
    "load_yaml",
    "niah_curves",
    "positions_summary",
    "run_training",
    "summarise",
]

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


def latest_checkpoint(name: str, save_folder: Path) -> Path:
    """The latest checkpoint of run `name` in `save_folder`, by OLMo's rule; `RepoError` if it saved none."""
    from olmo.util import find_latest_checkpoint  # ai2-olmo: seconds to import

    if (checkpoint := find_latest_checkpoint(save_folder)) is None:
        raise RepoError(f"{name} saved no checkpoint in {save_folder}")
    return Path(checkpoint)


def summarise(name: str, save_folder: Path, wall_s: float, checkpoint: Path) -> RunResult:
    """The run in `save_folder`, from its metrics.jsonl, with its `checkpoint`."""
    metrics_path = save_folder / METRICS_FILE
    records = read_metrics(metrics_path) if metrics_path.is_file() else []
    train = [r for r in records if LOSS in r]
    if not train:
        raise RepoError(f"{name} logged no training step in {metrics_path}")
    evals = [r[k] for r in records for k in r if k.startswith("eval/") and k.endswith("CrossEntropyLoss")]
    speeds = [r[SPEED] for r in train if SPEED in r]
    return RunResult(
        name=name,
        steps=train[-1]["step"],
        first_loss=train[0][LOSS],
        last_loss=train[-1][LOSS],
        eval_loss=evals[-1] if evals else None,
        tokens_per_s=statistics.median(speeds) if speeds else None,
        wall_s=wall_s,
        checkpoint=str(checkpoint),
        positions=positions_summary(train[-1], repo_layer_ids(_run_config(save_folder).model)),
    )


def _run_config(save_folder: Path) -> Any:
    """The run's config.yaml (written before its first step): what its metrics are named after."""
    return load_yaml(save_folder / "config.yaml")


def load_yaml(path: Path) -> Any:
    """The YAML file `path` as OmegaConf reads it (unresolved), read-only, parsed once per content: the demo's
    report and progress lines read the same configs over and over (160 reads of ~50 ms each in a tiny demo)."""
    return _parse_yaml(path.read_text())


@functools.lru_cache(maxsize=64)
def _parse_yaml(text: str) -> Any:
    config = OmegaConf.create(text)
    OmegaConf.set_readonly(config, True)  # shared by every caller: none may change it
    return config


def _niah_labels(config: Any) -> list[str]:
    """The labels of a run's in-loop NIAH evaluators (`niah_*`)."""
    return [str(e.label) for e in config.get("evaluators", []) if str(e.get("label", "")).startswith("niah_")]


def _niah_scores(record: dict[str, Any], labels: list[str]) -> dict[str, float]:
    """{variant: exact match} of the in-loop NIAH evaluations in one metrics record."""
    names = {label: metric_name(label, "exact_match") for label in labels}
    return {label: record[name] for label, name in names.items() if name in record}


def niah_curves(save_folder: Path) -> dict[int, dict[str, float]]:
    """{step: {variant: exact match}} of the in-loop NIAH evaluations in a run's metrics.jsonl."""
    labels = _niah_labels(_run_config(save_folder))
    curves: dict[int, dict[str, float]] = {}
    for record in read_metrics(save_folder / METRICS_FILE):
        if scores := _niah_scores(record, labels):
            curves.setdefault(record["step"], {}).update(scores)
    return curves


class _Progress:
    """Prints `name step N/MAX  loss L  ETA` for every training record that metrics.jsonl gains, and the mean
    in-loop NIAH exact match of every evaluation step once all its variants are in."""

    def __init__(self, name: str, metrics_path: Path):
        self.name, self.path, self.start = name, metrics_path, 0  # start: of the last line read
        self.max_steps: int | None = None  # from the run's config.yaml (written before its first step)
        self.first: tuple[int, float] | None = None  # (step, time) of the first step seen by this start
        self.shown: set[tuple[str, int]] = set()  # ("loss" or "niah", step) printed
        self.niah: dict[int, dict[str, float]] = {}
        self.labels: list[str] = []  # of the in-loop NIAH evaluators

    def update(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self.start)
            new = f.read()
        lines = new[: new.rfind(b"\n") + 1].splitlines(keepends=True)  # a line being written: once complete
        if not lines:
            return
        # The last line is read again next time: the trainer merges the rest of its step into it (`append_metrics`).
        self.start += sum(map(len, lines[:-1]))
        for record in map(json.loads, lines):
            self._niah(record)
            if LOSS in record and ("loss", record["step"]) not in self.shown:
                self.shown.add(("loss", record["step"]))
                self._step(record)

    def _read_config(self) -> None:
        if self.max_steps is None:
            config = _run_config(self.path.parent)
            duration = config.get("max_duration")
            self.max_steps = duration if isinstance(duration, int) else 0
            self.labels = _niah_labels(config)

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
        if not any(key.startswith("eval/") for key in record):
            return
        self._read_config()
        if not (scores := _niah_scores(record, self.labels)):
            return
        at = self.niah.setdefault(record["step"], {})
        at.update(scores)
        if len(at) == len(self.labels) and ("niah", record["step"]) not in self.shown:
            self.shown.add(("niah", record["step"]))
            mean = 100 * sum(at.values()) / len(at)
            print(
                f"   {self.name} step {record['step']:>7}  in-loop NIAH exact match {mean:.0f}% "
                f"(mean of {len(at)} variants)",
                flush=True,
            )


def positions_summary(metrics: dict[str, float], layers: list[int]) -> str:
    """`layer:[min,max]` of the RePo `layers` in a metrics record (keys `POSITIONS_METRIC`), or "-"."""
    spans = []
    for i in layers:
        lo, hi = (metrics.get(POSITIONS_METRIC.format(layer=i, stat=stat)) for stat in ("min", "max"))
        if lo is not None and hi is not None:
            spans.append(f"{i}:[{lo:.2g},{hi:.2g}]")
    return " ".join(spans) or "-"
