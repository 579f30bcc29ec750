"""Documents of the tiny offline lm-eval tasks: read from `repo_tiny.jsonl` beside this file, no download."""

from __future__ import annotations

import json
from pathlib import Path

import datasets


def load_docs(**_: object) -> datasets.DatasetDict:
    """lm-eval `custom_dataset`: the jsonl as a one-split ("test") DatasetDict."""
    lines = (Path(__file__).parent / "repo_tiny.jsonl").read_text().splitlines()
    return datasets.DatasetDict(
        {"test": datasets.Dataset.from_list([json.loads(line) for line in lines if line])}
    )
