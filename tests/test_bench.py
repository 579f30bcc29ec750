"""A smoke run of the benchmark at tiny size: it runs, and its output has the promised form."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.slow
def test_benchmark_smoke(tmp_path):
    """Multi-head and grouped-query attention in one run (as `make bench` runs them), side by side."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "bench_repo.py"),
        "--size",
        "tiny,tiny-gqa",
        "--reps",
        "2",
        "--batch",
        "3",
        "--json",
        str(out),
        "--profile",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    assert proc.stdout.startswith("profile, one step each: RoPE")
    for phase in ("steps and decodes, 4 models: 100%", "pieces of a RePo layer: 100%"):  # progress, on stderr
        assert phase in proc.stderr
    assert "_Rotate" in proc.stdout  # RePo's rotation shows up among the added ops
    # RePo's kernels run on CUDA only: here the torch code, and the reports say so.
    assert proc.stdout.count("kernels=off (the torch code)") == 2 and "kernels=triton" not in proc.stdout
    assert proc.stdout.count(" batch=3x32 ") == 2  # --batch replaces the sizes' micro-batch of 2
    assert proc.stdout.count("targets (issue 49, the 1B on one H200): RePo/RoPE") == 2
    for what in ("step", "memory", "decode"):
        assert re.search(rf"^  {what} +\d+\.\d{{4}}  target <= \d\.\d{{4}}  (met|MISSED)", proc.stdout, re.M)
    lines = proc.stdout.strip().splitlines()
    results = json.loads(out.read_text())
    assert list(results) == ["tiny", "tiny-gqa"]
    table = lines.index(next(line for line in lines if line.startswith("side by side, RePo/RoPE")))
    for i, (size, result) in enumerate(results.items()):
        assert (
            set(result["step_s"]) == {"rope", "repo", "nope", "repo-reference"}
            and result["shape"]["batch"] == 3
        )
        assert result["kernels"] is None and "rotation-kernel" not in result["component_s"]
        assert all(len(v) == 2 and min(v) > 0 for v in result["step_s"].values())
        assert all(v > 0 for v in result["peak_step_memory_bytes"].values())
        ratio = result["ratios_vs_rope"]["repo"]
        last = lines[-2 + i]
        number = r"\d+\.\d{3}"
        assert re.fullmatch(rf"RePo/RoPE step={number} memory={number} decode={number} \[{size}\]", last), (
            last
        )
        assert f"step={ratio['step']:.3f}" in last and f"decode={ratio['decode']:.3f}" in last
        row = lines[table + 2 + i].split()
        assert row[0] == size and row[1] == f"{ratio['step']:.3f}" and row[-1] == f"{ratio['decode']:.3f}"


@pytest.mark.slow  # the benchmark script in a subprocess
@pytest.mark.parametrize("args", [["--json", "/nonexistent/bench.json"], ["--size", "cpu,nope"]])
def test_bad_arguments_stop_before_measuring(args):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_repo.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith("bench_repo.py: error: "), (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and not proc.stdout


@pytest.mark.slow  # 8 tiny models, the kernels under Triton's interpreter
def test_saved_bytes_smoke(tmp_path):
    """bench_saved.py (make bench) at tiny widths: RePo's layer keeps nothing of its own for f_phi under bf16
    autocast (its activation checkpoint shares att_proj's bf16 x), and its extra is within the allowance, on the
    kernels and on the torch code, multi-head and grouped."""
    out = tmp_path / "saved.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "bench_saved.py"),
        "--width",
        "tiny",
        "--tokens",
        "16",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    results = json.loads(out.read_text())["bytes_per_token"]
    assert set(results) == {"kernels, MHA", "kernels, GQA 8/4", "torch, MHA", "torch, GQA 8/4"}
    for r in results.values():
        assert r["f_phi"] == 0 and 0 < r["extra"] == r["rest"] <= 3500, results
    assert "allowance 3,500" in proc.stdout and proc.stdout.count(" within") == 4, proc.stdout
