"""A training run's metrics as its readers see them (the demo, reports, tests), with no trainer imported:
`save_folder/metrics.jsonl`, one JSON record per logged step, which both trainers write, and the names of the
in-loop evaluators' metrics in it. Standard library only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["METRICS_FILE", "metric_name", "read_metrics"]

METRICS_FILE = "metrics.jsonl"
"""In a run's save folder: every logged step once, `{"step": N, name: value, ...}` at full precision."""


def metric_name(label: str, metric: str) -> str:
    """The name an in-loop evaluator's metric is logged under (OLMo's `eval/{label}/{metric}`), e.g.
    `metric_name("niah_single_1", "exact_match")`: a reader of the logs looks its entries up by label."""
    return f"eval/{label}/{metric}"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl: one per logged step (training and evaluation)."""
    return [json.loads(line) for line in path.read_text().splitlines()]
