"""The same model on both trainers: an ai2-olmo RePo model (built and run in .venv by tests/core/olmo_reference.py,
converted to HF by the ai2-olmo side) -> OLMo-core (`core_convert_from_hf`) gives the ai2-olmo logits and
positions in fp32 within the rounding bound."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.hf import hf_to_core
from olmo_repo.rope import record_positions

from .tiny import assert_within, logit_roundings
from .training import ROOT

pytestmark = pytest.mark.slow  # a process of the ai2-olmo environment

OLMO_PYTHON = ROOT / ".venv" / "bin" / "python"


@pytest.mark.skipif(not OLMO_PYTHON.is_file(), reason="needs the ai2-olmo environment (.venv: make install)")
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_ai2_olmo_repo_model_has_the_same_logits_and_positions_on_olmo_core(tmp_path, kv_heads):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    script = ROOT / "tests" / "core" / "olmo_reference.py"
    done = subprocess.run(
        [str(OLMO_PYTHON), str(script), str(tmp_path), str(BASE_DIR / "tokenizer.json"), str(kv_heads)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reference = torch.load(tmp_path / "reference.pt", weights_only=False)
    core_dir = hf_to_core(tmp_path / "hf", tmp_path / "core")
    config = checkpoint.model_config(core_dir)
    model = checkpoint.load_model(core_dir).eval()
    with torch.no_grad(), record_positions(model) as positions:
        logits = model(reference["ids"])
    roundings = 2 * logit_roundings(config, 24)
    assert_within(logits, reference["logits"], roundings=roundings, what="logits")
    assert sorted(positions) == sorted(reference["positions"]) == [1, 2, 3]
    for layer, z in reference["positions"].items():
        assert z.shape == (2, kv_heads, 24)
        assert_within(positions[layer], z, roundings=roundings, what=f"positions of layer {layer}")
