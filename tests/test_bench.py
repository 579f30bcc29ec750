"""A smoke run of the benchmark at tiny size: it runs, and its output has the promised form."""

from __future__ import annotations

import json
import os
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


@pytest.mark.long  # ~90 s on 2 cores: tiny models, the kernels under Triton's interpreter, 6 processes
def test_the_gpu_run_at_cpu_size_records_itself(tmp_path):
    """bench/gpu_check.sh's machinery (SMOKE=1): its parts in order, each logged as it ends, then gpu_summary.py's
    dated JSON and the table for bench/RESULTS.md, every target met, missed (with what holds it) or not measured;
    and bench_saved.py's figures (make bench) within the allowance, f_phi keeping nothing of its own."""
    out = tmp_path / "gpu-out"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CORE_PYTHON")}
    env.update(SMOKE="1", PY=sys.executable, OUT=str(out))
    cmd = ["bash", str(ROOT / "bench" / "gpu_check.sh")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = [line.split()[0] for line in (out / "parts.log").read_text().splitlines()]
    assert parts == ["kernels", "check-cost", "saved", "bench-tiny"]
    record = json.loads(next(out.glob("gpu-run-*.json")).read_text())
    rows = {(r["part"], r["what"]): r for r in record["rows"]}
    assert (
        rows[("kernels", "tests")]["met"] is True
        and rows[("OLMo-core", "step, memory, decode")]["met"] is None
    )
    assert {r["what"] for r in record["rows"] if r["part"] == "ai2-olmo tiny"} == {"step", "memory", "decode"}
    saved = json.loads((out / "saved.json").read_text())["bytes_per_token"]
    assert set(saved) == {"kernels, MHA", "kernels, GQA 8/4", "torch, MHA", "torch, GQA 8/4"}
    for name, r in saved.items():
        assert r["f_phi"] == 0 and 0 < r["extra"] == r["rest"], saved
        assert rows[("memory", f"saved bytes per token per layer, {name}")]["met"] is True
    table = (out / "results-table.md").read_text().splitlines()
    assert table[0] == "| part | what | measured | target | met |" and len(table) == len(record["rows"]) + 2
    lines = proc.stdout.splitlines()
    verdicts = lines[lines.index(next(x for x in lines if x.startswith("== the run's targets"))) + 1 :]
    assert len(verdicts) >= len(record["rows"])
    assert all(re.match(r"  (met|MISSED|not measured) |    held by: ", line) for line in verdicts), verdicts
