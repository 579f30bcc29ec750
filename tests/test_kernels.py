"""RePo's Triton kernels without a GPU: under Triton's interpreter against float64 and the torch reference
(tests/kernel_checks.py), compiled for sm_90 (tests/kernel_compile_checks.py), each in a process of its own (the
mode is fixed when `@triton.jit` runs); and `olmo_repo.rope` without Triton, as a converted checkpoint's remote
code runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import ROOT


def _pytest(path: str, tmp_path, interpret: bool) -> None:
    """Run the tests of `path` in a new process (no conftest: the kernels' tests need torch and Triton only),
    Triton's cache in tmp_path so that every kernel is compiled by this run."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), **({"TRITON_INTERPRET": "1"} if interpret else {}))
    command = [sys.executable, "-m", "pytest", *"-q -rs -n 0 --noconftest -p no:cacheprovider".split(), path]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and " skipped" not in result.stdout, (
        result.stdout[-6000:] + result.stderr[-2000:]
    )


@pytest.mark.slow  # ~15 s: the interpreter runs each program in numpy
def test_kernels_under_the_interpreter_against_float64_and_the_reference(tmp_path):
    _pytest("tests/kernel_checks.py", tmp_path, interpret=True)


@pytest.mark.slow  # ~15 s: 7 compilations to cubins
def test_every_kernel_compiles_for_hopper_without_a_gpu(tmp_path):
    _pytest("tests/kernel_compile_checks.py", tmp_path, interpret=False)


WITHOUT_TRITON = """
import sys
import torch
from torch import nn

def check(rope):
    class Layer(rope.RepoLayer, nn.Module):
        def __init__(self):
            super().__init__()
            self.init_repo("repo", layer_id=0, d_model=64, n_kv_heads=2, head_dim=16, rope_theta=1e4)

    layer = Layer()
    rope.set_kernels(layer, "kernels")  # the kernels asked for everywhere: without them the torch code runs
    q, k = layer.reposition(torch.randn(1, 5, 64), torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16))
    assert rope.__package__ + ".kernels" not in sys.modules and q.shape == (1, 4, 5, 16), rope.__name__

sys.path.insert(0, sys.argv[1])
import checkpoint_code.rope  # Triton importable, the kernels package absent: a converted checkpoint's code
check(checkpoint_code.rope)
sys.modules["triton"] = None  # import triton raises ImportError, as where it is not installed
import olmo_repo.rope
check(olmo_repo.rope)
print("ok")
"""


def test_rope_runs_without_triton_and_without_the_kernels(tmp_path):
    """`rope.py` imports the kernels only where they run, guarded: as remote code (beside rotation.py and modes.py
    in a folder of their own, without the kernels package) and without Triton, a RePo layer runs the torch code."""
    folder = tmp_path / "checkpoint_code"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name in ("rope.py", "rotation.py", "modes.py"):  # what a converted checkpoint carries of the rule set
        (folder / name).write_text((ROOT / "olmo_repo" / name).read_text())
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-c", WITHOUT_TRITON, str(tmp_path)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
