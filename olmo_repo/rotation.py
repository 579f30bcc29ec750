"""RoPE from real positions, torch only: the rotation a RePo layer applies to q and k (`olmo_repo.rope`), the
reference of RePo's rotation kernel (`olmo_repo.kernels.rotation`). It travels with `rope.py` into converted
Hugging Face checkpoints as remote code: keep it torch-only.

For a head of size d and a real position z, pair k (k < d/2) of a query or key vector is rotated by the angle

    angle_k = z * inv_freq_k,    inv_freq_k = theta^(-2k/d)   (or the config's scaled RoPE: linear, YaRN)

in the split-halves layout (element k pairs with element k + d/2, "rotate_half"). With z = 0..T-1 this is
stock RoPE. Angles are computed in fp32 with autocast off, whatever the model's dtype.

`rotate` is the training path: a custom autograd function that keeps only the positions and the rotated
output (which attention keeps anyway) for backward, instead of per-head cos/sin tables [B, H, T, d]. Its
gradient with respect to the positions follows from d(R(a) x)/da = R(a + pi/2) x:

    out = (x1 cos - x2 sin, x2 cos + x1 sin)
    dL/dx   = (g1 cos + g2 sin, g2 cos - g1 sin)                  # R^T g
    dL/dz   = sum_k inv_freq_k * (g2_k out1_k - g1_k out2_k)      # summed over a query group

On CUDA it runs through torch.compile (`COMPILED_ROTATION`), which fuses its ~10 elementwise passes per
direction; on CPU eagerly (compiling costs seconds per process and would not repay itself). `bench/bench_repo.py`
times every variant.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "COMPILED_ROTATION",
    "inv_frequencies",
    "no_autocast",
    "rotate",
    "rotate_forward",
    "rotate_qk",
    "rotate_reference",
]


def no_autocast(device: str) -> contextlib.AbstractContextManager:
    """Autocast off on `device`; no context at all where it is off already (a decode step enters this for
    every RePo layer, and the context costs microseconds)."""
    if torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


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
    """`rotate`'s forward without its autograd wrapper (which torch.compile cannot trace): every x [..., d]
    rotated by positions broadcastable to x.shape[:-1], fp32 angles; each result laid out in memory as its x is
    (attention's output then follows q's layout, and the output projection reads it without a copy, as after a
    RoPE layer)."""
    with no_autocast(positions.device.type):
        dtype = _compute_dtype(xs[0], positions)
        cos, sin = _cos_sin(positions, inv_freq, dtype)
        outs = []
        for x in xs:
            x1, x2 = x.to(dtype).chunk(2, dim=-1)
            out = torch.empty_like(x)
            out[..., : x1.shape[-1]] = x1 * cos - x2 * sin  # rounded into x's dtype by the copy
            out[..., x1.shape[-1] :] = x2 * cos + x1 * sin
            outs.append(out)
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
                # [..., H, T], summed over what the positions were broadcast to (a GQA query group)
                term = ((g2 * o1 - g1 * o2) * inv_freq).sum(-1).sum_to_size(positions.shape)
                grad_pos = term if grad_pos is None else grad_pos + term
    return (None if grad_pos is None else grad_pos.to(positions.dtype)), grad_xs


def _specialisation(args: tuple) -> tuple:
    """What torch.compile (dynamic shapes) compiles a graph per: each tensor's device, dtype and number of dims,
    every other argument's value (lists of tensors looked into)."""
    key = []
    for arg in args:
        for a in arg if isinstance(arg, list) else (arg,):
            key.append((a.device, a.dtype, a.dim()) if isinstance(a, Tensor) else a)
    return tuple(key)


class _CompileOrFallBack:
    """`torch.compile(fn)`, built once on first use; where compiling fails, `fn` itself from then on for that
    specialisation only (`_specialisation`: `failed`), with one warning; other specialisations still compile."""

    def __init__(self, fn: Callable):
        self.fn, self.compiled, self.failed = fn, None, set()
        self._lock = threading.Lock()

    def __call__(self, *args):
        key = _specialisation(args)
        if key in self.failed:
            return self.fn(*args)
        if self.compiled is None:
            with self._lock:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, dynamic=True)
        try:
            return self.compiled(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # no compiler or Triton, an unsupported torch: the eager path is exact too
            with self._lock:
                first = key not in self.failed
                self.failed.add(key)
            if first:
                warnings.warn(
                    f"torch.compile of {self.fn.__name__} failed, running it eagerly for this specialisation: "
                    f"{e!r}",
                    stacklevel=2,
                )
            return self.fn(*args)


_EAGER = (rotate_forward, _rotate_backward)
COMPILED_ROTATION = (_CompileOrFallBack(rotate_forward), _CompileOrFallBack(_rotate_backward))
"""The rotation's forward and backward through torch.compile, each with its own per-specialisation fallback."""


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
    """Rotate x [B, H, T, d] by per-head positions [B, H, T] (fp32; any shape that broadcasts to
    x.shape[:-1]). Returns x's shape and dtype.

    `compiled`: run the rotation through torch.compile; None (the default) does so on CUDA only.
    """
    return _Rotate.apply(positions, inv_freq, x.is_cuda if compiled is None else compiled, x)[0]


def rotate_qk(
    q: Tensor, k: Tensor, positions: Tensor, inv_freq: Tensor, compiled: bool | None = None
) -> tuple[Tensor, Tensor]:
    """`rotate` for a layer's q and k [B, H, T, d] at once, sharing the cos/sin work (positions broadcast to
    both)."""
    return _Rotate.apply(positions, inv_freq, q.is_cuda if compiled is None else compiled, q, k)


def rotate_reference(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """The plain formula, differentiated by autograd (materialises cos/sin). For tests and benchmarks."""
    with torch.autocast(x.device.type, enabled=False):
        dtype = _compute_dtype(x, positions)
        cos, sin = _cos_sin(positions, inv_freq, dtype)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)  # [B, H, T, d]
        x1, x2 = x.to(dtype).chunk(2, dim=-1)
        return (x.to(dtype) * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)
