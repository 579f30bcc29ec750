"""f_phi's tail in Triton: z = final_map(SiLU(gate) * content), fp32, in one pass, and its backward in another.

`olmo_repo.rope.f_phi` runs gate_map and content_map as one GEMM with fp32 output on CUDA (the two weights joined
at each call), whose [..., 2 * hidden] result, gate then content, this kernel reads once: SiLU, the product and
the hidden -> H_kv projection (H_kv: key/value heads, 1-32) never leave registers, where torch runs four passes
and keeps SiLU(gate) * content. The backward reads the same input and dL/dz and writes dL/d(gate, content) in
the joined layout (the GEMM's backward takes it as it is) and final_map's gradient as one partial sum per
program, which torch adds up (no atomics: deterministic). All arithmetic is fp32; final_map is read in its own
dtype and its gradient returned in it. SiLU's exp is Triton's (ex2.approx on NVIDIA: relative error about
|gate| eps, far inside f_phi's bound of a d_model-long sum's roundings).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from . import select

__all__ = ["f_phi_tail", "ready"]

TILE = 8192
"""Elements of a program's [rows, heads, hidden] product tile: hidden's block = TILE / (ROWS x heads' block)."""
ROWS = 16
"""Rows (tokens) per program and loop step."""
PROGRAMS = 512
"""At most this many programs in the backward: each adds its rows' share of final_map's gradient [H_kv, hidden]
into a partial sum of its own, which torch sums (512 x 16 x 256 fp32 = 8 MiB at the 1B's MHA)."""
OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _silu_parts(gc_ptr, rows, cols, mask, hidden, gc_sn):
    """gate, content and sigmoid(gate) [BLOCK_N, BLOCK_K] fp32 of the joined rows (gate then content)."""
    gc = gc_ptr + rows[:, None] * gc_sn + cols[None, :]
    gate = tl.load(gc, mask=mask, other=0.0).to(tl.float32)
    content = tl.load(gc + hidden, mask=mask, other=0.0).to(tl.float32)
    return gate, content, tl.sigmoid(gate)


@triton.jit
def tail_fwd(
    gc_ptr, w_ptr, z_ptr, N, hidden, n_out, gc_sn, w_sh, z_sn,
    BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """z [N, n_out] (row stride z_sn) = (SiLU(gate) * content) @ w^T, gate and content the halves of gc rows."""
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_N, BLOCK_H], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        gate, content, sig = _silu_parts(
            gc_ptr, rows, cols, (rows < N)[:, None] & (cols < hidden)[None, :], hidden, gc_sn
        )
        h = gate * sig * content  # [BLOCK_N, BLOCK_K]
        w_mask = (heads < n_out)[:, None] & (cols < hidden)[None, :]
        w = tl.load(w_ptr + heads[:, None] * w_sh + cols[None, :], mask=w_mask, other=0.0).to(tl.float32)
        acc += tl.sum(h[:, None, :] * w[None, :, :], axis=2)
    z_mask = (rows < N)[:, None] & (heads < n_out)[None, :]
    tl.store(z_ptr + rows[:, None] * z_sn + heads[None, :], acc, mask=z_mask)


@triton.jit
def tail_bwd(
    gc_ptr, w_ptr, dz_ptr, dgc_ptr, dw_ptr, N, hidden, n_out, gc_sn, w_sh, dz_sn, dz_sh, dgc_sn,
    BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """dL/d(gate, content) into dgc [N, 2 * hidden] (row stride dgc_sn) and this program's partial sum of dL/dw
    into dw [programs, n_out, hidden], from dz [N, n_out]; rows pid, pid + programs, ... (blocks of BLOCK_N)."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    heads = tl.arange(0, BLOCK_H)
    for k0 in range(0, hidden, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        w_mask = (heads < n_out)[:, None] & (cols < hidden)[None, :]
        # w transposed, [BLOCK_K, BLOCK_H], so that dh sums over the last axis: Triton's combine pass rewrites
        # sum(a[:, :, None] * b[None, :, :], axis=1) into a tt.dot, which gave wrong dL/d(gate, content) on an
        # H100 (Triton 3.6, 1 to 16 heads). tests/kernel_compile_checks.py asserts that no kernel has a tt.dot.
        w_t_mask = (cols < hidden)[:, None] & (heads < n_out)[None, :]
        w_t = tl.load(w_ptr + heads[None, :] * w_sh + cols[:, None], mask=w_t_mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float32)
        for r0 in range(pid * BLOCK_N, N, programs * BLOCK_N):
            rows = (r0 + tl.arange(0, BLOCK_N)).to(tl.int64)
            dz_mask = (rows < N)[:, None] & (heads < n_out)[None, :]
            dz = tl.load(dz_ptr + rows[:, None] * dz_sn + heads[None, :] * dz_sh, mask=dz_mask, other=0.0)
            mask = (rows < N)[:, None] & (cols < hidden)[None, :]
            gate, content, sig = _silu_parts(gc_ptr, rows, cols, mask, hidden, gc_sn)
            dh = tl.sum(dz[:, None, :] * w_t[None, :, :], axis=2)  # [BLOCK_N, BLOCK_K]
            silu = gate * sig
            dgc = dgc_ptr + rows[:, None] * dgc_sn + cols[None, :]
            tl.store(dgc, dh * content * (sig * (1.0 + gate * (1.0 - sig))), mask=mask)
            tl.store(dgc + hidden, dh * silu, mask=mask)
            dw += tl.sum(dz[:, :, None] * (silu * content)[:, None, :], axis=0)
        tl.store(dw_ptr + (pid * n_out + heads[:, None]) * hidden + cols[None, :], dw, mask=w_mask)


def _blocks(n_out: int, hidden: int) -> dict:
    block_h = triton.next_power_of_2(n_out)
    block_k = max(1, min(triton.next_power_of_2(hidden), TILE // (ROWS * block_h)))
    return {"BLOCK_N": ROWS, "BLOCK_H": block_h, "BLOCK_K": block_k}


def _rows(gate_content: Tensor) -> Tensor:
    """gate_content [..., 2 * hidden] as rows [N, 2 * hidden] with a contiguous last dim."""
    rows = gate_content.reshape(-1, gate_content.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _tail_forward(gate_content: Tensor, final_map: Tensor) -> Tensor:
    """`f_phi_tail` without autograd."""
    gc, w = _rows(gate_content), final_map.contiguous()
    n_out, hidden = w.shape
    assert gc.shape[-1] == 2 * hidden, "gate_content must hold gate and content, each of final_map's width"
    z = torch.empty(gc.shape[0], n_out, dtype=torch.float32, device=gc.device)  # [N, H_kv]
    if z.numel():
        tail_fwd[(triton.cdiv(gc.shape[0], ROWS),)](
            gc, w, z, gc.shape[0], hidden, n_out, gc.stride(0), w.stride(0), z.stride(0),
            **_blocks(n_out, hidden), **OPTIONS,
        )  # fmt: skip
    return z.view(*gate_content.shape[:-1], n_out)


def _tail_backward(
    gate_content: Tensor, final_map: Tensor, dz: Tensor, programs: int | None = None
) -> tuple[Tensor, Tensor]:
    """dL/d(gate, content) [N, 2 * hidden] and dL/d final_map [H_kv, hidden], both fp32, from dz [..., H_kv];
    `programs`: how many share the rows (default: one per block of ROWS rows, at most PROGRAMS)."""
    gc, w = _rows(gate_content), final_map.contiguous()
    n_out, hidden = w.shape
    dz = dz.reshape(-1, n_out).float().contiguous()  # [N, H_kv], contiguous: the layout `ready` checked
    N = gc.shape[0]
    programs = programs or max(1, min(triton.cdiv(N, ROWS), PROGRAMS))
    dgc = torch.empty(N, 2 * hidden, dtype=torch.float32, device=gc.device)
    dw = torch.empty(programs, n_out, hidden, dtype=torch.float32, device=gc.device)
    if N:
        tail_bwd[(programs,)](
            gc, w, dz, dgc, dw, N, hidden, n_out, gc.stride(0), w.stride(0), *dz.stride(), dgc.stride(0),
            **_blocks(n_out, hidden), **OPTIONS,
        )  # fmt: skip
    else:
        dw.zero_()
    return dgc, dw.sum(0)


class _Tail(torch.autograd.Function):
    """`f_phi_tail` with autograd: saves its two inputs (f_phi is recomputed in backward under mixed precision,
    `rope.RepoLayer.predict_positions`, so they live only for the layer's backward)."""

    @staticmethod
    def forward(ctx, gate_content: Tensor, final_map: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate_content, final_map)
        return _tail_forward(gate_content, final_map)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dz: Tensor) -> tuple[Tensor | None, Tensor | None]:  # type: ignore[override]
        gate_content, final_map = ctx.saved_tensors
        dgc, dw = _tail_backward(gate_content, final_map, dz)
        grad_gc = dgc.view(gate_content.shape).to(gate_content.dtype) if ctx.needs_input_grad[0] else None
        grad_w = dw.to(final_map.dtype) if ctx.needs_input_grad[1] else None
        return grad_gc, grad_w


def f_phi_tail(gate_content: Tensor, final_map: Tensor) -> Tensor:
    """z = (SiLU(gate) * content) @ final_map^T, fp32 [..., H_kv], for gate_content [..., 2 * hidden] (fp32: gate
    then content, the joined input projections' output) and final_map [H_kv, hidden] (any float dtype, read as
    fp32). Differentiable in both."""
    if torch.is_grad_enabled() and (gate_content.requires_grad or final_map.requires_grad):
        return _Tail.apply(gate_content, final_map)
    return _tail_forward(gate_content, final_map)


# ------------------------------------------------------------------------ the check before a variant first runs


def ready(rows: int, final_map: Tensor, grad: bool) -> bool:
    """Whether `f_phi_tail` may run on `rows` tokens with this final_map [H_kv, hidden] here (`select.verdict`):
    its forward and, with `grad`, its backward at this specialisation (final_map's dtype and layout, the heads,
    the hidden width and the blocks they give, Triton's class of the row count) checked on this device."""
    call = (
        final_map.device,
        final_map.dtype,
        final_map.shape,
        final_map.stride(),
        final_map.data_ptr() % 16,
        rows,
    )
    return select.remembered((*call, grad), lambda: _verdict(rows, final_map, grad))


def _verdict(rows: int, final_map: Tensor, grad: bool) -> bool:
    n_out, hidden = final_map.shape
    blocks = _blocks(n_out, hidden)
    key = (
        final_map.device, "f_phi tail", final_map.dtype, n_out, hidden, select.int_class(rows),
        tuple(blocks.values()), select.layout(final_map), grad,
    )  # fmt: skip

    def describe() -> str:
        return (
            f"f_phi tail ({rows} rows, final_map {str(final_map.dtype)[6:]} {tuple(final_map.shape)}, blocks "
            f"{blocks['BLOCK_N']} x {blocks['BLOCK_H']} x {blocks['BLOCK_K']}{', with its backward' if grad else ''})"
        )

    return select.verdict(key, functools.partial(_check, rows, final_map, grad), describe)


def _check(rows: int, final_map: Tensor, grad: bool) -> list[select.Agreement]:
    """The kernels at `select.check_length` rows (the backward's on one program, which loops over them) on
    normal samples (gate and content x 3) against float64."""
    gen = torch.Generator().manual_seed(0)
    n_out, hidden = final_map.shape
    N = select.check_length(rows, ROWS)
    gc = (torch.randn(N, 2 * hidden, generator=gen) * 3).to(final_map.device)  # the joined GEMM's fp32 output
    w = select.alike(final_map, final_map.shape, gen)
    g, c, w64 = *gc.double().chunk(2, dim=-1), w.double()
    h, spread = F.silu(g) * c, g.abs().max().item()  # SiLU's exp: relative error about |gate| eps
    truth = h @ w64.T
    found = [select.agreement("z", _tail_forward(gc, w), truth, hidden + 8 + spread, h.abs() @ w64.abs().T)]
    if not grad:
        return found
    dz = torch.randn(N, n_out, generator=gen).to(final_map.device)
    dgc, dw = _tail_backward(gc, w, dz, programs=1)
    dz64 = dz.double()
    dh, dh_size = dz64 @ w64, dz64.abs() @ w64.abs()  # [N, hidden]
    sig = torch.sigmoid(g)
    dgc_truth = torch.cat((dh * c * sig * (1 + g * (1 - sig)), dh * F.silu(g)), dim=-1)
    dgc_size = torch.cat((dh_size * c.abs() * (1 + g.abs()), dh_size * F.silu(g).abs()), dim=-1)
    found.append(select.agreement("dL/d(gate, content)", dgc, dgc_truth, n_out + 10 + spread, dgc_size))
    found.append(select.agreement("dL/d final_map", dw, dz64.T @ h, N + 8 + spread, dz64.abs().T @ h.abs()))
    return found
