"""`scripts/prepare_data.py` as the tests run it: in its own environment (`.venv-data`), from any session, on
corpora the tests write (`tests/corpus_files.py`), and what it wrote read back document by document."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_PYTHON = ROOT / ".venv-data" / "bin" / "python"
SCRIPT = ROOT / "scripts" / "prepare_data.py"
needs_data_env = pytest.mark.skipif(
    not DATA_PYTHON.is_file(), reason="needs the data environment (.venv-data: make install-data)"
)


def prepare_data(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """The command with `args` (no progress bar); on `check`, its failure raises with its output."""
    done = subprocess.run(
        [str(DATA_PYTHON), str(SCRIPT), "--no-progress", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=600,
    )
    if check and done.returncode:
        raise AssertionError(
            f"prepare_data.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
        )
    return done


def prepare_each(model: Path, inputs: list[Path], runs: list[tuple[Path, int, int]]) -> None:
    """`olmo_repo.data.prepare.prepare` of `inputs` into each (folder, shard tokens, tasks) of `runs`, one worker,
    in one process of the data environment (a sweep of settings without a command's start-up for each)."""
    script = (
        "import json, sys; from olmo_repo.data.prepare import prepare\n"
        "a = json.loads(sys.argv[1])\n"
        "for out, shard, tasks in a['runs']:\n"
        "    prepare(a['model'], a['inputs'], out, shard_tokens=shard, tasks=tasks, workers=1, progress=False)\n"
    )
    spec = {
        "model": str(model),
        "inputs": list(map(str, inputs)),
        "runs": [(str(o), s, t) for o, s, t in runs],
    }
    done = subprocess.run(
        [str(DATA_PYTHON), "-c", script, json.dumps(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    if done.returncode:
        raise AssertionError(f"prepare of {runs} failed:\n{done.stdout}\n{done.stderr[-3000:]}")


def write_corpus(files: dict[Path, list[dict]]) -> None:
    """Corpus files, each in its suffix's format (`tests/corpus_files.py`; .jsonl.zst in .venv-data, which has
    zstandard)."""
    from . import corpus_files

    zst = {str(k): v for k, v in files.items() if str(k).endswith(".zst")}
    for path, records in files.items():
        if not str(path).endswith(".zst"):
            corpus_files.write(path, records)
    if zst:
        script = ROOT / "tests" / "corpus_files.py"
        subprocess.run([str(DATA_PYTHON), str(script)], input=json.dumps(zst), text=True, check=True)


def documents(folder: Path) -> list[tuple[int, ...]]:
    """Every document of a finished data folder, as its ids (the end id included), shard by shard: cut at the
    offsets of each shard's `.csv.gz`, which must tile the shard."""
    data = json.loads((folder / "data.json").read_text())
    out: list[tuple[int, ...]] = []
    for shard in data["shards"]:
        ids = np.fromfile(folder / shard["path"], dtype="<u4")
        assert len(ids) == shard["tokens"], shard
        rows = (
            gzip.decompress((folder / shard["path"].replace(".npy", ".csv.gz")).read_bytes()).decode().split()
        )
        bounds = [tuple(map(int, r.split(","))) for r in rows]
        assert bounds[0][0] == 0 and bounds[-1][1] == len(ids) and len(bounds) == shard["documents"]
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        out += [tuple(ids[s:e].tolist()) for s, e in bounds]
    return out
