"""What only a GPU runs: nccl, CUDA autocast (OLMo autocasts on CUDA only), flash-attn, the bf16 GEMMs of f_phi,
torch.compile of the rotation on CUDA, and FSDP with meta init and the sharded checkpoint that SIGUSR1 writes.
FSDP itself (sharding, wrap policies, mixed precision, sharded checkpoints, stage-1 init) runs on CPU in
tests/test_train_fsdp.py.

Skipped without CUDA. On a GPU machine: `.venv/bin/python -m pytest tests/test_train_gpu.py` (or `bash bench/gpu_check.sh tests`).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from .numerics import assert_within
from .training import (
    STAGE1,
    STAGE2_REPO,
    small,
    stop_with_sigusr1,
    subprocess_env,
    train_command,
    write_corpus,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nccl, autocast, compile)")

GPU = dict(
    distributed_strategy="fsdp",
    precision="amp_bf16",
    **{"model.init_device": "meta", "fsdp.precision": "mixed", "fsdp.sharding_strategy": "SHARD_GRAD_OP"},
    sharded_checkpointer="olmo_core",
    save_interval_unsharded=3,
    max_duration=3,
    stop_at=3,  # the tiny configs stop at 100: without this the run goes on to the end of the data
)


def _run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


@pytest.mark.slow
def test_fsdp_stage1_then_repo_stage2_on_nccl_with_cuda_autocast(tmp_path):
    data = write_corpus(tmp_path / "data")
    _run(train_command(STAGE1, small(data, tmp_path / "stage1", **GPU)))
    stage1 = tmp_path / "stage1/step3-unsharded"
    assert (stage1 / "optim.pt").is_file()
    out = _run(train_command(STAGE2_REPO, small(data, tmp_path / "stage2", load_path=stage1, **GPU)))
    assert "Optimizer surgery: stage-1 state for" in out and "fresh state for 6 RePo parameters" in out
    records = [json.loads(line) for line in (tmp_path / "stage2/metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "train/CrossEntropyLoss" in r][-1]
    assert last["step"] == 3 and last["train/positions/layer2/std"] > 0
    # The stage-2 checkpoint holds the stage-1 base tensors moved by 3 steps and the RePo weights.
    weights = torch.load(tmp_path / "stage2/step3-unsharded/model.pt", weights_only=True)
    assert "transformer.blocks.1.gate_map.weight" in weights


@pytest.mark.slow
def test_fsdp_run_stopped_by_sigusr1_saves_a_sharded_checkpoint_and_resumes(tmp_path):
    """FSDP takes OLMo's other cancel branch: a sharded checkpoint at the stop step (as with the official configs,
    which keep no periodic sharded checkpoints: save_num_checkpoints_to_keep=0)."""
    data = write_corpus(tmp_path / "data")
    save = tmp_path / "run"
    steps = dict(
        max_duration=2000, stop_at=2000, save_interval_unsharded="null", save_num_checkpoints_to_keep=0
    )
    cmd = train_command(STAGE1, small(data, save, **{**GPU, **steps}))
    stopped, output = stop_with_sigusr1(cmd, save)
    assert 0 < stopped < 2000 and "rerun the same command to resume" in output
    assert (save / f"step{stopped}").is_dir() and not (save / f"step{stopped}-unsharded").exists()

    logged_before = len((save / "metrics.jsonl").read_text().splitlines())
    resumed = _run(cmd)  # the same command again
    assert f"Resuming from {save}/step{stopped} (latest" in resumed
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()[logged_before:]]
    assert [r["step"] for r in records if "train/CrossEntropyLoss" in r] == list(range(stopped + 1, 2001))


def test_f_phi_projections_are_bf16_gemms_with_fp32_results_on_cuda():
    from torch.utils._python_dispatch import TorchDispatchMode

    from olmo_repo.rope import LinearFp32Out

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, torch.dtype]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append((str(func), args[0].dtype))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 512, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16) / 45
    with Ops() as ops:
        out = LinearFp32Out.apply(x, w)
    assert ("aten.mm.dtype", torch.bfloat16) in ops.seen and out.dtype == torch.float32
    exact = torch.nn.functional.linear(x.double(), w.double())
    # Exact bf16 products summed over 2048 in fp32: at most 2048 roundings of the sum of |products|.
    magnitude = torch.nn.functional.linear(x.double().abs(), w.double().abs())
    assert_within(out, exact, roundings=2048, magnitude=magnitude, what="bf16 GEMM with fp32 output")


def test_repo_model_with_flash_attention_matches_sdpa_in_bf16():
    pytest.importorskip("flash_attn")
    from olmo_repo import build_model

    from .conftest import tiny_config

    ids = torch.randint(0, 100, (2, 64), device="cuda")
    logits = {}
    for flash in (False, True):
        torch.manual_seed(0)
        model = build_model(
            tiny_config(
                d_model=256,
                n_heads=4,
                pe_mode="repo",
                pe_start_layer=1,
                flash_attention=flash,
                init_device="cuda",
            )
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits[flash] = model(ids).logits.float()
    torch.testing.assert_close(logits[True], logits[False], rtol=2e-2, atol=2e-2)


def test_rotation_runs_compiled_on_cuda_and_matches_float64():
    from olmo_repo.rotation import COMPILED_ROTATION, inv_frequencies, rotate_qk

    q, k = torch.randn(2, 4, 64, 32, device="cuda"), torch.randn(2, 4, 64, 32, device="cuda")
    z = (torch.randn(2, 4, 64, device="cuda") * 100).requires_grad_()
    inv_freq = inv_frequencies(32, 500_000.0, torch.device("cuda"))
    q.requires_grad_()
    out = rotate_qk(q, k, z, inv_freq)  # CUDA tensors: compiled by default
    grads = torch.autograd.grad(sum(o.sum() for o in out), (q, z))
    # each half is compiled at its first call: the forward above, the backward by autograd.grad
    assert all(c.compiled is not None and not c.failed for c in COMPILED_ROTATION)
    q64, z64 = q.detach().double().requires_grad_(), z.detach().double().requires_grad_()
    exact = rotate_qk(q64, k.double(), z64, inv_freq.double(), compiled=False)
    exact_grads = torch.autograd.grad(sum(o.sum() for o in exact), (q64, z64))
    # fp32 angles z * inv_freq are off by up to u * |angle|, which moves cos/sin by as much: errors of about
    # u * (1 + max|angle|) * max|x| per element (u = 2^-24), and d/2 such terms summed in dL/dz.
    u, angle = 2.0**-24, z.abs().max().item() * inv_freq.max().item()
    for a, b in zip(out, exact):
        assert (a.double() - b).abs().max() <= 4 * u * (1 + angle) * b.abs().max()
    assert (grads[0].double() - exact_grads[0]).abs().max() <= 4 * u * (1 + angle) * 2
    assert (grads[1].double() - exact_grads[1]).abs().max() <= 4 * u * (1 + angle) * 32 * exact_grads[
        1
    ].abs().max()
