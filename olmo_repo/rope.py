"""RePo's math, torch only: f_phi (the positions) and RoPE from real, per-head positions.

This module is also copied into converted Hugging Face checkpoints as remote code: keep it torch-only.

f_phi maps the block input x [B, T, d_model] to one real position per head and token,

    z = final_map( SiLU(gate_map(x)) * content_map(x) )        # [B, T, H] -> [B, H, T]

with fp32 results, so that large positions are not quantised by bf16 (the reference rounds them to a step of
16 near 4096). gate_map and content_map (99.6% of f_phi's FLOPs) take their inputs at the model's compute
precision, like every other projection, but accumulate and return fp32: a product of two bf16 numbers is
exact in fp32, so this equals fp32 math on those inputs, at bf16 GEMM speed on a GPU (fp32 GEMMs run ~15x
slower there). The product and final_map run in fp32.

For a head of size d and a real position z, pair k (k < d/2) of a query or key vector is rotated by the angle

    angle_k = z * theta^(-2k/d)

in OLMo's split-halves layout (element k pairs with element k + d/2, "rotate_half"). With z = 0..T-1 this
is OLMo's own RoPE. Angles are computed in fp32 with autocast off, whatever the model's dtype.

`rotate` is the training path: a custom autograd function that keeps only the positions [B, H, T] and the
rotated output (which attention keeps anyway) for backward, instead of per-head cos/sin tables
[B, H, T, d]. Its gradient with respect to the positions follows from d(R(a) x)/da = R(a + pi/2) x:

    out = (x1 cos - x2 sin, x2 cos + x1 sin)
    dL/dx   = (g1 cos + g2 sin, g2 cos - g1 sin)                  # R^T g
    dL/dz   = sum_k inv_freq_k * (g2_k out1_k - g1_k out2_k)

On CUDA the rotation's forward and backward math run through torch.compile, which fuses its ~10 elementwise
passes over q and k per direction (2.3-6.6x faster forward+backward on CPU, bench/RESULTS.md); on CPU they
run eagerly: there the rotation is ~0.2% of a step and would not repay compiling (5-20 s per process).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "COMPILED_ROTATION",
    "LinearFp32Out",
    "f_phi",
    "inv_frequencies",
    "rotate",
    "rotate_forward",
    "rotate_qk",
    "rotate_reference",
]


def f_phi(x: Tensor, gate_map: Tensor, content_map: Tensor, final_map: Tensor) -> Tensor:
    """Positions [B, H, T] from x [B, T, d] and the three weights; fp32 (float64 for float64 inputs).

    The compute precision of the two input projections is autocast's dtype if autocast is on, else x's.
    """
    device = x.device.type
    autocast = torch.is_autocast_enabled(device) and x.dtype != torch.float64
    low = torch.get_autocast_dtype(device) if autocast else x.dtype
    dtype = torch.promote_types(low, torch.float32)
    with _no_autocast(device):
        if low in (torch.bfloat16, torch.float16):
            x = x.to(low)
            gate, content = _linear_fp32_out(x, gate_map.to(low)), _linear_fp32_out(x, content_map.to(low))
        else:
            x = x.to(dtype)
            gate, content = F.linear(x, gate_map.to(dtype)), F.linear(x, content_map.to(dtype))
        z = F.linear(F.silu(gate) * content, final_map.to(dtype))  # [B, T, H]
    return z.transpose(1, 2)


# torch.mm(..., out_dtype) is recent; converted checkpoints may meet an older torch (then: fp32 copies).
_MM_HAS_OUT_DTYPE = "out_dtype" in (torch.mm.__doc__ or "")


def _no_autocast(device: str) -> contextlib.AbstractContextManager:
    """Autocast off on `device`; no context at all where it is off already (a decode step enters this for
    every RePo layer, and the context costs microseconds)."""
    if torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def _mm_fp32_out(x: Tensor, w: Tensor) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])  # [N, k]
    if x.is_cuda and _MM_HAS_OUT_DTYPE:
        out = torch.mm(x2, w.t(), out_dtype=torch.float32)
    else:
        out = torch.mm(x2.float(), w.t().float())
    return out.view(*x.shape[:-1], w.shape[0])


def _linear_fp32_out(x: Tensor, w: Tensor) -> Tensor:
    """`LinearFp32Out`, without its autograd wrapper where no gradient is needed (inference: vLLM, HF
    `generate`): at a decode step's sizes the wrapper costs as much as the products themselves."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return LinearFp32Out.apply(x, w)
    return _mm_fp32_out(x, w)


class LinearFp32Out(torch.autograd.Function):
    """x [..., k] @ w [n, k]^T for bf16/fp16 x and w, accumulated in fp32 and returned fp32 [..., n].

    CUDA runs one low-precision GEMM with an fp32 output (`torch.mm(..., out_dtype=torch.float32)`); CPU (and
    an older torch) has no such kernel, so it multiplies fp32 copies, which gives the same numbers. The
    backward takes the incoming gradient at the compute precision, as autocast's matmuls do, and returns x's
    and w's dtypes.
    """

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return _mm_fp32_out(x, w)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        grad = grad.to(x.dtype)
        grad_x = grad @ w if ctx.needs_input_grad[0] else None  # [..., k]
        grad_w = (
            grad.reshape(-1, w.shape[0]).t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        )  # [n, k]
        return grad_x, grad_w


@functools.lru_cache(maxsize=16)
def inv_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> Tensor:
    """theta^(-2k/d) for k < d/2, fp32. Shape [d/2]. Cached: every RePo layer asks on every forward."""
    with torch.inference_mode(False):  # a cached inference tensor could not be saved for backward later
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def _compute_dtype(x: Tensor, positions: Tensor) -> torch.dtype:
    """fp32, or float64 when an input is float64 (gradcheck)."""
    return torch.promote_types(torch.promote_types(x.dtype, positions.dtype), torch.float32)


def _cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    angles = positions.to(dtype).unsqueeze(-1) * inv_freq.to(dtype)  # [B, H, T, d/2]
    return angles.cos(), angles.sin()


def rotate_forward(positions: Tensor, inv_freq: Tensor, xs: list[Tensor]) -> list[Tensor]:
    """`rotate`'s forward without its autograd wrapper (which torch.compile cannot trace): every x [..., T, d]
    rotated by positions [..., T] (broadcast over x's leading dims), fp32 angles."""
    with _no_autocast(positions.device.type):
        dtype = _compute_dtype(xs[0], positions)
        cos, sin = _cos_sin(positions, inv_freq, dtype)
        outs = []
        for x in xs:
            x1, x2 = x.to(dtype).chunk(2, dim=-1)
            outs.append(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype))
    return outs


def _rotate_backward(
    positions: Tensor,
    inv_freq: Tensor,
    grads: list[Tensor | None],
    outs: list[Tensor],
    need_x: list[bool],
    need_pos: bool,
) -> tuple[Tensor | None, list[Tensor | None]]:
    grad_pos, grad_xs = None, []
    with torch.autocast(positions.device.type, enabled=False):
        dtype = _compute_dtype(outs[0], positions)
        cos, sin = _cos_sin(positions, inv_freq, dtype)
        for grad, out, needed in zip(grads, outs, need_x):
            if grad is None:
                grad_xs.append(None)
                continue
            g1, g2 = grad.to(dtype).chunk(2, dim=-1)
            grad_xs.append(
                torch.cat((g1 * cos + g2 * sin, g2 * cos - g1 * sin), dim=-1).to(grad.dtype)
                if needed
                else None
            )
            if need_pos:
                o1, o2 = out.to(dtype).chunk(2, dim=-1)
                term = ((g2 * o1 - g1 * o2) * inv_freq).sum(-1)  # [B, H, T]
                grad_pos = term if grad_pos is None else grad_pos + term
    return (None if grad_pos is None else grad_pos.to(positions.dtype)), grad_xs


class _CompileOrFallBack:
    """`torch.compile(fn)`, built on first use; if compiling fails, `fn` itself from then on, with a warning."""

    def __init__(self, fn: Callable):
        self.fn, self.compiled, self.failed = fn, None, False

    def __call__(self, *args):
        if self.failed:
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True)
        try:
            return self.compiled(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # no compiler or Triton, an unsupported torch: the eager path is exact too
            self.failed = True
            warnings.warn(
                f"torch.compile of {self.fn.__name__} failed, running it eagerly: {e!r}", stacklevel=2
            )
            return self.fn(*args)


_EAGER = (rotate_forward, _rotate_backward)
COMPILED_ROTATION = (_CompileOrFallBack(rotate_forward), _CompileOrFallBack(_rotate_backward))


class _Rotate(torch.autograd.Function):
    """Rotate several tensors (a layer's q and k) by the same positions: cos/sin are computed once."""

    @staticmethod
    def forward(ctx, positions: Tensor, inv_freq: Tensor, compiled: bool, *xs: Tensor) -> tuple[Tensor, ...]:
        forward, ctx.backward_fn = COMPILED_ROTATION if compiled else _EAGER
        outs = forward(positions, inv_freq, list(xs))
        ctx.save_for_backward(positions, inv_freq, *outs)
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        positions, inv_freq, *outs = ctx.saved_tensors
        need_pos, _, _, *need_x = ctx.needs_input_grad
        grad_pos, grad_xs = ctx.backward_fn(positions, inv_freq, list(grads), outs, need_x, need_pos)
        return (grad_pos, None, None, *grad_xs)


def rotate(x: Tensor, positions: Tensor, inv_freq: Tensor, compiled: bool | None = None) -> Tensor:
    """Rotate x [B, H, T, d] by per-head positions [B, H, T] (fp32). Returns x's shape and dtype.

    `compiled`: run the rotation through torch.compile; None (the default) does so on CUDA only.
    """
    return _Rotate.apply(positions, inv_freq, x.is_cuda if compiled is None else compiled, x)[0]


def rotate_qk(
    q: Tensor, k: Tensor, positions: Tensor, inv_freq: Tensor, compiled: bool | None = None
) -> tuple[Tensor, Tensor]:
    """`rotate` for a layer's q and k [B, H, T, d] at once, sharing the cos/sin work."""
    return _Rotate.apply(positions, inv_freq, q.is_cuda if compiled is None else compiled, q, k)


def rotate_reference(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """The plain formula, differentiated by autograd (materialises cos/sin). For tests and benchmarks."""
    with torch.autocast(x.device.type, enabled=False):
        dtype = _compute_dtype(x, positions)
        cos, sin = _cos_sin(positions, inv_freq, dtype)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)  # [B, H, T, d]
        x1, x2 = x.to(dtype).chunk(2, dim=-1)
        return (x.to(dtype) * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)
