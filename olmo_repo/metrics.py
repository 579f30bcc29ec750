"""A training run's metrics file, `save_folder/metrics.jsonl`: one JSON record per logged step, written by both
trainers through `append_metrics` and `trim_metrics`, read by the demo, reports and tests with no trainer
imported; and the names of the in-loop evaluators' metrics in it. Standard library only.

A trainer logs a step's metrics in several calls (the training metrics, then each in-loop evaluator's, then
OLMo-core's checkpoint numbers): `append_metrics` merges a call for the step of the file's last record into that
record, so that the file holds one line per step and every call is on disk when it returns (a kill loses
nothing that was logged). A reader that follows the file as it grows (the demo's progress) re-reads its last
line."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .output import write_file

log = logging.getLogger(__name__)

__all__ = ["METRICS_FILE", "append_metrics", "metric_name", "read_metrics", "trim_metrics"]

METRICS_FILE = "metrics.jsonl"
"""In a run's save folder: every logged step once, `{"step": N, name: value, ...}` at full precision."""


def metric_name(label: str, metric: str) -> str:
    """The name an in-loop evaluator's metric is logged under (OLMo's `eval/{label}/{metric}`), e.g.
    `metric_name("niah_single_1", "exact_match")`: a reader of the logs looks its entries up by label."""
    return f"eval/{label}/{metric}"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl: one per logged step (training and evaluation)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def _last_line(f: Any, end: int) -> tuple[int, bytes]:
    """(offset, bytes) of the last complete line of the binary file `f` of size `end`; (end, b"") if none."""
    if end == 0:
        return end, b""
    chunk = 4096
    while True:
        start = max(0, end - chunk)
        f.seek(start)
        tail = f.read(end - start)
        cut = tail.rfind(b"\n", 0, len(tail) - 1)  # the newline before the last line (which ends with one)
        if cut >= 0 or start == 0:
            at = start + cut + 1
            return (at, tail[cut + 1 :]) if tail.endswith(b"\n") else (end, b"")
        chunk *= 4


def append_metrics(path: Path, step: int, metrics: Mapping[str, float]) -> None:
    """Add the metrics one call of a trainer logged at `step`: merged into the last record when that is this
    step's, else a new line. Full precision (float64)."""
    record = {k: float(v) for k, v in metrics.items()}
    with open(path, "a+b") as f:
        end = f.seek(0, os.SEEK_END)
        at, last = _last_line(f, end)
        if last:
            try:
                previous = json.loads(last)
            except ValueError:
                previous = None
            if isinstance(previous, dict) and previous.get("step") == step:
                record = {**previous, **record}
                f.truncate(at)
        f.write(
            (json.dumps({"step": step, **{k: v for k, v in record.items() if k != "step"}}) + "\n").encode()
        )


def trim_metrics(path: Path, step: int) -> int:
    """Drop the records after `step` (and a line cut short by a kill) from metrics.jsonl, which a run resumed at
    `step` logs again; returns how many were dropped. The file is replaced whole (a kill leaves the old one)."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)

    def keep(line: str) -> bool:
        try:
            return line.endswith("\n") and json.loads(line)["step"] <= step
        except (ValueError, KeyError, TypeError):
            return False

    kept = [line for line in lines if keep(line)]
    if len(kept) < len(lines):
        write_file(path, "".join(kept))
        log.info(
            "%s: %d records after step %d dropped (logged again now)", path, len(lines) - len(kept), step
        )
    return len(lines) - len(kept)
