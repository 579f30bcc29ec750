"""Each of RePo's Triton kernels compiles for Hopper (sm_90) through Triton's own compiler, without a device: to
PTX and, with the ptxas that the triton wheel ships, to a cubin. A kernel that would not lower fails here, on CPU.

Run by tests/test_kernels.py in a process of its own without TRITON_INTERPRET (the mode is fixed when
`@triton.jit` runs, at import). The argument types are those the launches in `olmo_repo.kernels` pass: pointers
(`*_ptr`) of the tensors' dtypes, `scale` fp32, every other runtime argument an i32 (sizes and strides).
"""

from __future__ import annotations

import os
import re

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from olmo_repo.kernels import f_phi, rotation

assert not os.environ.get("TRITON_INTERPRET"), "run by tests/test_kernels.py, with Triton's compiler"
HOPPER = GPUTarget("cuda", 90, 64)


def compile_for_hopper(kernel, pointers: dict[str, str], constexprs: dict, options: dict):
    """`kernel` compiled for sm_90 with these pointer dtypes (default fp32) and constexpr values."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*" + pointers.get(name, "fp32")
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=HOPPER, options=options)


def assert_no_dot(compiled) -> None:
    """No tt.dot in the Triton IR: the kernels multiply and sum in fp32 on CUDA cores. Triton's combine pass
    turns sum(a[:, :, None] * b[None, :, :], axis=1) into a tt.dot, which gave wrong gradients on an H100
    (Triton 3.6, f_phi's backward at 1 to 16 heads) while the interpreter, which runs no such pass, agreed
    with float64."""
    dots = [line.strip() for line in compiled.asm["ttir"].splitlines() if "tt.dot" in line]
    assert not dots, f"a product-sum became a tt.dot: {dots[0]}"


def _approximate(ptx: str) -> set[str]:
    """The PTX's approximate transcendental instructions (fast math)."""
    return set(re.findall(r"\b(?:sin|cos|lg2|ex2|rsqrt|rcp)\.approx\S*", ptx))


def _atomics(ptx: str) -> list[str]:
    """The PTX's atomic instructions (atom.*, red.*)."""
    return re.findall(r"^\s*(?:atom|red)\.\S+", ptx, flags=re.MULTILINE)


def _blocks(d: int) -> dict:
    """The blocks a rotation launch picks for the 1B's 4 x 4096 tokens at head size d."""
    launch = rotation._launch_shape(4096, d, 4, 16)
    launch.pop("grid")
    return launch


EVERY_GRADIENT = {"NEED_DQ": True, "NEED_DK": True, "NEED_DZ": True}
ONLY_DZ = {"NEED_DQ": False, "NEED_DK": False, "NEED_DZ": True}
ROTATION = {  # name: (kernel, q and k's dtype, constexprs)
    "forward bf16, d 128": (rotation.rotate_fwd, "bf16", _blocks(128)),
    "forward fp32, d 256": (rotation.rotate_fwd, "fp32", _blocks(256)),
    "backward bf16, every gradient, d 128": (rotation.rotate_bwd, "bf16", {**_blocks(128), **EVERY_GRADIENT}),
    "backward fp32, dL/dz only, d 64": (
        rotation.rotate_bwd, "fp32", {**_blocks(64), **ONLY_DZ}),
}  # fmt: skip


@pytest.mark.parametrize("case", ROTATION)
def test_rotation_compiles_for_hopper_with_precise_sin_cos(case):
    kernel, dtype, constexprs = ROTATION[case]
    tensors = [
        name
        for name in kernel.arg_names
        if name.endswith("_ptr") and name not in ("z_ptr", "f_ptr", "dz_ptr")
    ]
    compiled = compile_for_hopper(kernel, dict.fromkeys(tensors, dtype), constexprs, rotation.OPTIONS)
    assert compiled.asm["cubin"], "no cubin"
    ptx = compiled.asm["ptx"]
    assert ".target sm_90" in ptx
    assert not _approximate(ptx), f"fast-math instructions in the rotation: {_approximate(ptx)}"
    assert not _atomics(ptx), "the rotation's backward sums over a query group in registers"
    assert_no_dot(compiled)


@pytest.mark.parametrize(
    "kernel, blocks",
    [
        (f_phi.tail_fwd, {"BLOCK_N": 16, "BLOCK_H": 16, "BLOCK_K": 32}),  # the 1B's 16 heads
        (f_phi.tail_fwd, {"BLOCK_N": 16, "BLOCK_H": 1, "BLOCK_K": 256}),  # one key/value head
        (f_phi.tail_bwd, {"BLOCK_N": 16, "BLOCK_H": 4, "BLOCK_K": 128}),  # 4 key/value heads (GQA)
        (f_phi.tail_bwd, {"BLOCK_N": 16, "BLOCK_H": 16, "BLOCK_K": 32}),
        (f_phi.tail_bwd, {"BLOCK_N": 16, "BLOCK_H": 1, "BLOCK_K": 256}),
    ],
)
def test_f_phi_tail_compiles_for_hopper(kernel, blocks):
    assert blocks == f_phi._blocks(blocks["BLOCK_H"], 256), "the blocks the launch picks at hidden 256"
    compiled = compile_for_hopper(kernel, {}, blocks, f_phi.OPTIONS)
    assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]
    assert not _atomics(compiled.asm["ptx"]), "final_map's gradient is summed per program, then by torch"
    assert_no_dot(compiled)
