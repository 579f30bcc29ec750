"""Tokens/s of `scripts/prepare_data.py` (datatrove, .venv-data) against `scripts/tokenize_text.py` (one process,
.venv-core) on the same text, side by side: `make bench-data`, or

    .venv-data/bin/python bench/bench_data.py [--model DIR] [--copies 20] [--rounds 3]

The text is Python's documentation (`pydoc_data.topics`, one document per topic) `--copies` times, as text
files (tokenize_text.py) and as the same documents in 4 jsonl files (prepare_data.py, every core, its record
check included). Each round runs both commands moments apart as a user runs them (the whole command: start,
checks, tokenising, writing), in a new order; the ratio is taken within each round (`bench/ratios.py`). The
machine's load average (`uptime`) is printed with the figures: a shared machine's load changes them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ratios import median_ci, within_round  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYTHON = {"prepare_data": ROOT / ".venv-data/bin/python", "tokenize_text": ROOT / ".venv-core/bin/python"}


def corpus(root: Path, copies: int) -> list[str]:
    """The documents as text files (tokenize_text.py's input) and as 4 jsonl files (prepare_data.py's)."""
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)] * copies
    (root / "text").mkdir()
    for i, text in enumerate(texts):
        (root / "text" / f"{i:06d}.txt").write_text(text)
    (root / "jsonl").mkdir()
    for part in range(4):
        lines = "".join(json.dumps({"text": t}) + "\n" for t in texts[part::4])
        (root / "jsonl" / f"{part}.jsonl").write_text(lines)
    return texts


def command(name: str, model: str, root: Path, out: Path) -> list[str]:
    script = [str(PYTHON[name]), str(ROOT / "scripts" / f"{name}.py"), "--model", model, "--output", str(out)]
    if name == "tokenize_text":
        return [*script, "--no-progress", "--text", *sorted(map(str, (root / "text").iterdir()))]
    return [*script, "--no-progress", str(root / "jsonl")]


def tokens(name: str, out: Path) -> int:
    if name == "tokenize_text":
        return (out / "train.npy").stat().st_size // 4
    return json.loads((out / "data.json").read_text())["tokens"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=str(ROOT / "olmo_repo/experiments/demo/base_model"), help="whose tokenizer"
    )
    parser.add_argument("--copies", type=int, default=20, help="copies of pydoc's topics (~113K tokens each)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for python in PYTHON.values():
        if not python.is_file():
            parser.error(f"{python} is missing: make install-data install-core")
    rate: dict[str, list[float]] = {name: [] for name in PYTHON}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        root = Path(tmp)
        texts = corpus(root, args.copies)
        print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} MB of text; {os.cpu_count()} cores")
        rng = random.Random(0)
        for r in range(args.rounds):
            for name in rng.sample(list(PYTHON), len(PYTHON)):
                out = root / f"out-{name}"
                start = time.perf_counter()
                subprocess.run(command(name, args.model, root, out), check=True, stdout=subprocess.DEVNULL)
                seconds = time.perf_counter() - start
                rate[name].append(tokens(name, out) / seconds)
                print(f"round {r + 1}: {name:14s} {tokens(name, out):>11,} tokens {seconds:7.1f} s "
                      f"{rate[name][-1]:>11,.0f} tokens/s")  # fmt: skip
                shutil.rmtree(out)
    ratios = within_round(rate["prepare_data"], rate["tokenize_text"])
    low, high = median_ci(ratios)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(
        f"prepare_data.py {statistics.median(rate['prepare_data']):,.0f} tokens/s, tokenize_text.py "
        f"{statistics.median(rate['tokenize_text']):,.0f} tokens/s: prepare/tokenize={statistics.median(ratios):.3f} "
        f"(95% interval {low:.3f}-{high:.3f}); {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
