"""A smoke run of the OLMo-core benchmark at tiny size: it runs, and its output has the promised form."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow  # the benchmark in a subprocess
def test_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "bench_core.py",
        "--size",
        "tiny",
        "--reps",
        "2",
        "--batch",
        "1",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=BENCH, capture_output=True, text=True, check=True, timeout=600)
    assert "steps and decodes, 4 models: 100%" in proc.stderr  # progress
    result = json.loads(out.read_text())
    variants = {"rope", "repo", "rope-gqa", "repo-gqa"}
    assert result["batch"] == 1  # --batch replaces the size's micro-batch of 2
    assert set(result["times"]) == set(result["decode_s_per_token"]) == set(result["memory"]) == variants
    assert all(
        len(v) == 2 and min(v) > 0
        for v in [*result["times"].values(), *result["decode_s_per_token"].values()]
    )
    number = r"\d+\.\d{4}"
    last = proc.stdout.strip().splitlines()[-2:]
    for line, label, name in zip(last, ("RePo/RoPE", "RePo/RoPE GQA"), ("repo", "repo-gqa"), strict=True):
        assert re.fullmatch(rf"{label} step={number} memory={number} decode={number}", line), line
        r = result["ratios"][name]
        assert f"step={r['step']:.4f} memory={r['memory']:.4f} decode={r['decode']:.4f}" in line
        assert r["memory"] > 1.0  # f_phi's weights and gradients


def test_the_decoded_model_is_the_converted_one():
    """What the benchmark decodes is the OLMo-core model as transformers runs it: the same logits."""
    sys.path.insert(0, str(BENCH))
    try:
        import bench_core
    finally:
        sys.path.remove(str(BENCH))
    import torch

    from .tiny import assert_within, logit_roundings

    size = bench_core.SIZES["tiny"]
    for mode, kv in (("repo", None), ("repo", 1)):
        model = bench_core.build(size, mode, kv, "cpu").eval()
        hf = bench_core.as_hf(model, size, mode, kv, "cpu")
        ids = torch.randint(0, size.vocab, (1, 16))
        roundings = 2 * logit_roundings(bench_core.config(size, mode, kv, "cpu"), 16)
        with torch.no_grad():
            assert_within(hf(ids).logits, model(ids), roundings=roundings, what=f"{mode}, {kv} KV heads")
