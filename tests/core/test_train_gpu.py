"""What only a GPU runs on the OLMo-core side: `core_train.py` on nccl, FSDP with bf16 parameters (fp32 reduce),
from the base model converted to OLMo-core, RePo positions logged each step, a checkpoint written. The same run
on CPU (gloo, fp32) is tests/core/test_train.py. In-loop NIAH is off, as in tests/test_train_gpu.py: it needs
the eval extra (lm-eval's RULER generator), which the GPU image lacks.

Skipped without CUDA. On a GPU machine: `bash bench/gpu_check.sh tests`, or
`.venv-core/bin/python -m pytest --confcutdir tests/core tests/core/test_train_gpu.py`.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.olmocore.hf import hf_to_core

from .training import ROOT, TINY, metrics, random_corpus

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nccl, bf16 FSDP)"),
    pytest.mark.slow,
]

STEPS = 4


def test_fsdp_bf16_run_on_nccl_logs_losses_and_positions(tmp_path):
    data = random_corpus(tmp_path / "data")
    base = hf_to_core(BASE_DIR, tmp_path / "base")
    save = tmp_path / "run"
    command = [
        sys.executable, str(ROOT / "scripts" / "core_train.py"), "--nproc-per-node=1", str(TINY),
        f"--save-folder={save}", f"--data-root={data}", f"--load_path={base}",
        f"--trainer.max_duration.value={STEPS}", "--train_module.dp_config.param_dtype=bfloat16",
        "--trainer.callbacks.niah.enabled=false",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env={**env, "WANDB_MODE": "disabled"}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    logged = metrics(save)
    assert max(logged) == STEPS
    losses = [logged[step]["train/CE loss"] for step in range(1, STEPS + 1)]
    assert all(math.isfinite(loss) for loss in losses), losses
    # RePo from layer 1: f_phi's positions spread (not all one value) in bf16 too
    assert all(logged[step]["train/positions/layer1/std"] > 0 for step in range(1, STEPS + 1))
    assert (save / f"step{STEPS}").is_dir()
    print(f"OLMo-core on CUDA, FSDP bf16: CE loss by step {[round(x, 4) for x in losses]}")
