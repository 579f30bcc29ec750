"""A smoke run of the benchmark at tiny size: it runs, and its output has the promised form."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("size", ["tiny", "tiny-gqa"])  # multi-head and grouped-query attention
def test_benchmark_smoke(tmp_path, size):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "bench_repo.py"),
        "--size",
        size,
        "--reps",
        "2",
        "--json",
        str(out),
        "--profile",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    assert proc.stdout.startswith("profile, one step each: RoPE")
    for phase in ("steps and decodes, 4 models: 100%", "pieces of a RePo layer: 100%"):  # progress, on stderr
        assert phase in proc.stderr
    assert "_Rotate" in proc.stdout  # RePo's rotation shows up among the added ops
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"RePo/RoPE step=\d+\.\d{3} memory=\d+\.\d{3} decode=\d+\.\d{3}", last), last
    result = json.loads(out.read_text())
    assert set(result["step_s"]) == {"rope", "repo", "nope", "repo-reference"}
    assert all(len(v) == 2 and min(v) > 0 for v in result["step_s"].values())
    assert all(v > 0 for v in result["peak_step_memory_bytes"].values())
    ratio = result["ratios_vs_rope"]["repo"]
    assert f"step={ratio['step']:.3f}" in last
