"""The one RePo layer core, torch only: f_phi (the positions), RoPE from real positions, and `RepoLayer`.

Every backend (the OLMo block, the Hugging Face and vLLM attentions, the OLMo-core attention) mixes
`RepoLayer` into the module that owns q and k, and keeps only its own plumbing (cache, bias channel, dtype
policy). This file also travels into converted Hugging Face checkpoints as remote code (with `modes.py`):
keep it torch-only.

f_phi maps a layer's input x [..., T, d_model] to one real position per key/value head and token,

    z = final_map( SiLU(gate_map(x)) * content_map(x) )        # [..., T, H_kv] -> [..., H_kv, T]

with fp32 results, so that large positions are not quantised by bf16 (the reference rounds them to a step of
16 near 4096). gate_map and content_map (d_model -> d_model // 8, `modes.F_PHI_HIDDEN_RATIO`) take their
inputs at the model's compute precision, like every other projection, but accumulate and return fp32: a
product of two bf16 numbers is exact in fp32, so this equals fp32 math on those inputs, at bf16 GEMM speed
on a GPU. The product and final_map run in fp32. With grouped-query attention the query heads of a group
share their key/value head's position, so the score of query head h in group g is q_i^T R(z_j^g - z_i^g) k_j
and the KV cache keeps its grouped size; with n_kv_heads == n_heads this is the paper's one position per head.

For a head of size d and a real position z, pair k (k < d/2) of a query or key vector is rotated by the angle

    angle_k = z * inv_freq_k,    inv_freq_k = theta^(-2k/d)   (or the config's scaled RoPE: linear, YaRN)

in the split-halves layout (element k pairs with element k + d/2, "rotate_half"). With z = 0..T-1 this is
stock RoPE. Angles are computed in fp32 with autocast off, whatever the model's dtype. YaRN's attention
factor multiplies the rotated q and k, as stock RoPE layers apply it to cos/sin.

`rotate` is the training path: a custom autograd function that keeps only the positions and the rotated
output (which attention keeps anyway) for backward, instead of per-head cos/sin tables [B, H, T, d]. Its
gradient with respect to the positions follows from d(R(a) x)/da = R(a + pi/2) x:

    out = (x1 cos - x2 sin, x2 cos + x1 sin)
    dL/dx   = (g1 cos + g2 sin, g2 cos - g1 sin)                  # R^T g
    dL/dz   = sum_k inv_freq_k * (g2_k out1_k - g1_k out2_k)      # summed over a query group

On CUDA, f_phi and the rotation run RePo's own Triton kernels (`olmo_repo.kernels`; where: `set_kernels` and
`OLMO_REPO_KERNELS`, decided in `olmo_repo.kernels.select`, each variant checked on its device first): gate_map
and content_map as one GEMM with fp32 output (their weights joined at each call), SiLU, product and final_map in
one pass, and the rotation of a key/value head's query group and key in one pass per direction, angles fp32 in
the kernel. The torch code in this file is their reference and runs everywhere else: on CPU (eagerly: compiling
costs seconds per process and would not repay itself), for float64 and tensor-parallel (DTensor) weights, inside
torch.compile's tracing (which fuses it: vLLM's compiled model), and where Triton or the kernels are absent (a
converted checkpoint's remote code carries this file without them). Without the kernels, `rotate_qk` runs
through torch.compile on CUDA, which fuses its ~10 elementwise passes per direction (`bench/bench_repo.py` times
every variant).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .modes import (
    F_PHI_HIDDEN_RATIO,
    F_PHI_WEIGHTS,
    INDEX_BLEND_METRIC,
    POSITIONS_METRIC,
    PositionMode,
    PositionSource,
)

__all__ = [
    "COMPILED_ROTATION",
    "LinearFp32Out",
    "RepoLayer",
    "blend_positions",
    "check_final_map_rows",
    "f_phi",
    "inv_frequencies",
    "observe_positions",
    "position_stats",
    "rank_kv_heads",
    "record_positions",
    "repo_layers",
    "rotate",
    "rotate_forward",
    "rotate_qk",
    "rotate_reference",
    "set_index_blend",
    "set_kernels",
    "spread",
]


def f_phi(
    x: Tensor, gate_map: Tensor, content_map: Tensor, final_map: Tensor, *, kernels: str | None = None
) -> Tensor:
    """Positions [..., H, T] from x [..., T, d] and the three weights (H: final_map's rows); fp32 (float64 for
    float64 inputs).

    The compute precision of the two input projections is autocast's dtype if autocast is on, else x's.
    `kernels`: where RePo's kernels run (`KERNELS`; None: as `OLMO_REPO_KERNELS` says, on CUDA).
    """
    device = x.device.type
    autocast = torch.is_autocast_enabled(device) and x.dtype != torch.float64
    low = torch.get_autocast_dtype(device) if autocast else x.dtype
    dtype = torch.promote_types(low, torch.float32)
    with _no_autocast(device):
        if low in (torch.bfloat16, torch.float16):
            x = x.to(low)
            project = lambda w: _linear_fp32_out(x, w.to(low))  # noqa: E731
        else:
            x = x.to(dtype)
            project = lambda w: F.linear(x, w.to(dtype))  # noqa: E731
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, gate_map, content_map, final_map))
        run = _kernels(kernels, x, gate_map, content_map, final_map)
        if run is not None and run.f_phi_ready(x.numel() // max(x.shape[-1], 1), final_map, grad):
            # One GEMM for both input projections. Their weights are joined at each call (2 x hidden x d_model, a
            # copy of microseconds), so that they stay the parameters that FSDP shards, the optimizer updates in
            # place and checkpoints name; a cached join would go stale.
            gate_content = project(torch.cat((gate_map, content_map)))  # [..., T, 2 * hidden] fp32
            z = run.f_phi_tail(gate_content, final_map)  # [..., T, H]
        else:
            z = F.linear(F.silu(project(gate_map)) * project(content_map), final_map.to(dtype))  # [..., T, H]
    return z.transpose(-1, -2)


KERNELS = (None, "torch", "kernels")
"""Where a RePo layer runs RePo's kernels (`RepoLayer.repo_kernels`, `set_kernels`): None as `OLMO_REPO_KERNELS`
says (`olmo_repo.kernels.select`: on CUDA, each variant checked there first, by default), "torch" nowhere (the
torch code: benchmarks compare the two), "kernels" on every device (CPU tensors too, under Triton's interpreter,
`TRITON_INTERPRET=1`: how the tests run them without a GPU)."""


def _kernels(where: str | None, *tensors: Tensor) -> ModuleType | None:
    """`olmo_repo.kernels` if its kernels are wanted on these tensors (`KERNELS`), else None: the torch code runs.
    None also inside torch.compile's tracing (it fuses the torch code itself; vLLM's compiled model), for dtypes
    or tensors the kernels do not take (`kernels.supports`), and where they do not import. Whether a kernel's
    variant then runs is the kernel module's `ready`."""
    if where == "torch" or (where is None and not tensors[0].is_cuda) or _compiling():
        return None  # (asked before the import: a traced graph must not break, vLLM's is traced whole)
    kernels = _import_kernels()
    if kernels is None or not kernels.supports(*tensors):
        return None
    return kernels if kernels.select.wanted(where, tensors[0].device) else None


# torch.compiler.is_compiling (torch >= 2.3); a converted checkpoint may meet an older torch, which cannot trace.
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


@functools.cache
def _import_kernels() -> ModuleType | None:
    """`olmo_repo.kernels`, or None without Triton or without the package: this file is the remote code of
    converted checkpoints, which carry it without the kernels (transformers' import check skips try blocks)."""
    try:
        from . import kernels
    except ImportError:
        return None
    return kernels


# torch.mm(..., out_dtype) (the `aten::mm.dtype` overload) is recent; converted checkpoints may meet an older torch
# (then: fp32 copies).
_MM_HAS_OUT_DTYPE = "dtype" in getattr(torch.ops.aten.mm, "overloads", list)()


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
    """`rotate`'s forward without its autograd wrapper (which torch.compile cannot trace): every x [..., d]
    rotated by positions broadcastable to x.shape[:-1], fp32 angles; each result laid out in memory as its x is
    (attention's output then follows q's layout, and the output projection reads it without a copy, as after a
    RoPE layer)."""
    with _no_autocast(positions.device.type):
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
    """`torch.compile(fn)`, built on first use; where compiling fails, `fn` itself from then on for that
    specialisation (`_specialisation`: `failed`), with one warning; other specialisations still compile."""

    def __init__(self, fn: Callable):
        self.fn, self.compiled, self.failed = fn, None, set()

    def __call__(self, *args):
        key = _specialisation(args)
        if key in self.failed:
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True)
        try:
            return self.compiled(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # no compiler or Triton, an unsupported torch: the eager path is exact too
            self.failed.add(key)
            warnings.warn(
                f"torch.compile of {self.fn.__name__} failed, running it eagerly for this specialisation: {e!r}",
                stacklevel=2,
            )
            return self.fn(*args)


_EAGER = (rotate_forward, _rotate_backward)
COMPILED_ROTATION = (_CompileOrFallBack(rotate_forward), _CompileOrFallBack(_rotate_backward))


class _SharedCast(torch.autograd.Function):
    """`low` (x cast to a lower precision, made once) as one reader's cast of x: the same storage for every reader,
    each with a gradient of its own that returns to x in x's dtype (what autocast's cast of x does)."""

    @staticmethod
    def forward(ctx, x: Tensor, low: Tensor) -> Tensor:  # type: ignore[override]
        ctx.dtype = x.dtype
        return low.view_as(low)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad.to(ctx.dtype), None


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


# ------------------------------------------------------------------------------------------ the RePo layer


class RepoLayer:
    """The RePo part of the module that owns a layer's q and k, as a mixin (it has no `__init__`).

    The owner (`olmo_repo.ai2olmo.block.RepoSequentialBlock`, the HF and vLLM `RepoOlmo2Attention`, the OLMo-core
    attention) calls `init_repo` after its own `__init__`, then `predict_positions(x)` and
    `apply_positions(q, k, positions)` (or both at once: `reposition`) where its stock code applies RoPE.
    In `repo` mode `init_repo` adds f_phi's weights as the owner's own children (`<owner>.gate_map.weight`,
    ...: the state-dict names of every checkpoint) and `positions_out`, the one place where positions are
    observed (`observe_positions`). `nope` layers rotate nothing. Stock RoPE layers are not `RepoLayer`s.
    """

    pe_mode: PositionMode = PositionMode.rope
    layer_id: int
    f_phi_rows: range
    index_blend: float = 0.0
    """p of the index blend (`modes.PositionKeys`): q and k are rotated by (1 - p) z + p i. The trainers set it
    every step (`set_index_blend`); HF and vLLM from the config's `pe_blend`."""
    position_source: PositionSource = PositionSource.learned
    """What q and k are rotated by (`modes.PositionSource`): f_phi's positions, or, as an ablation at
    evaluation, the token index or one constant position."""
    """The rows of final_map (key/value heads) this module holds: all of them, or a tensor-parallel slice."""
    repo_kernels: str | None = None
    """Where this layer runs RePo's kernels (`KERNELS`, `set_kernels`); None: as `OLMO_REPO_KERNELS` says."""

    def init_repo(
        self,
        pe_mode: str,
        *,
        layer_id: int,
        d_model: int,
        n_kv_heads: int,
        head_dim: int,
        rope_theta: float | None = None,
        kv_heads: range | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        index_blend: float = 0.0,
        position_source: str = "learned",
    ) -> None:
        """Set the layer up for `pe_mode`; in `repo` mode add f_phi: gate_map, content_map (d_model ->
        d_model // F_PHI_HIDDEN_RATIO) and final_map (-> one position per key/value head: `n_kv_heads`, or
        `kv_heads`, this tensor-parallel rank's heads), `nn.Linear`s without bias (OLMo's optimizer grouping
        and FSDP expect modules, not bare parameters).

        `rope_theta` and `head_dim` give the inverse frequencies of stock RoPE; a backend whose RoPE may be
        scaled (linear, YaRN) overrides `rope_frequencies` instead. `index_blend` and `position_source`: what
        an inference config scores with (`modes.ScoredPositionKeys`: `pe_blend`, `pe_positions`).
        """
        assert isinstance(self, nn.Module), "RepoLayer is mixed into an nn.Module"
        self.pe_mode, self.layer_id = PositionMode(str(pe_mode)), layer_id
        self.index_blend, self.position_source = float(index_blend), PositionSource(str(position_source))
        self.repo_head_dim, self.repo_rope_theta = head_dim, rope_theta
        if self.pe_mode != PositionMode.repo:
            return
        self.repo_n_kv_heads = n_kv_heads
        self.f_phi_rows = range(n_kv_heads) if kv_heads is None else kv_heads
        hidden = d_model // F_PHI_HIDDEN_RATIO
        shapes = ((d_model, hidden), (d_model, hidden), (hidden, len(self.f_phi_rows)))
        for name, (d_in, d_out) in zip(F_PHI_WEIGHTS, shapes, strict=True):
            self.add_module(name, nn.Linear(d_in, d_out, bias=False, device=device, dtype=dtype))
        # Hook point, no parameters: `observe_positions` reads the positions [..., H_kv, T] passing through.
        self.positions_out = nn.Identity()
        self.register_load_state_dict_pre_hook(_check_loaded_f_phi)

    def f_phi_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """gate_map, content_map, final_map's weights, in `f_phi`'s order."""
        return tuple(getattr(self, name).weight for name in F_PHI_WEIGHTS)  # type: ignore[return-value]

    def rope_frequencies(self, device: torch.device) -> tuple[Tensor, float]:
        """The inverse frequencies [head_dim / 2] (fp32) and attention factor that positions are rotated with:
        stock RoPE of `rope_theta` here (and factor 1)."""
        assert self.repo_rope_theta is not None, (
            "init_repo(rope_theta=...) or an override of rope_frequencies"
        )
        return inv_frequencies(self.repo_head_dim, self.repo_rope_theta, device), 1.0

    def _f_phi(self, x: Tensor, where: str | None) -> Tensor:
        return f_phi(x, *self.f_phi_weights(), kernels=where)

    @contextmanager
    def shared_cast(self, x: Tensor, *readers: nn.Module) -> Iterator[Tensor]:
        """What f_phi is to read of the layer input x [..., T, d_model] while the owner's `readers` (its projections
        that read x too: OLMo's att_proj) run: under autocast with autograd, one cast of an fp32 x to autocast's
        dtype, handed to f_phi and (by a forward pre-hook, while the block runs) to each reader called on x, so
        that autograd keeps one low-precision copy of x for all of them instead of one more for f_phi's
        activation checkpoint; each reader's gradient returns to x in fp32, as autocast's own cast's does. Else x
        itself."""
        device = x.device.type
        if not (torch.is_grad_enabled() and torch.is_autocast_enabled(device) and x.dtype == torch.float32):
            yield x
            return
        low = x.detach().to(torch.get_autocast_dtype(device))

        def hand(_module: nn.Module, args: tuple) -> tuple | None:
            return (_SharedCast.apply(x, low), *args[1:]) if args and args[0] is x else None

        hooks = [reader.register_forward_pre_hook(hand) for reader in readers]
        try:
            yield _SharedCast.apply(x, low)
        finally:
            for hook in hooks:
                hook.remove()

    def predict_positions(self, x: Tensor) -> Tensor:
        """f_phi: the layer's input x [..., T, d_model] -> positions [..., H_kv, T], fp32 (float64 for a float64
        model), passed through `positions_out` (observed there)."""
        device = x.device.type
        mixed = x.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled(device)
        if mixed and torch.is_grad_enabled():
            # Autograd would keep a low-precision copy of x and f_phi's fp32 activations, up to 2x the layer
            # input's memory per RePo layer; recomputing them in backward costs f_phi's forward once more. The
            # checkpoint keeps its input: x at the compute precision (what f_phi's projections read, cast here
            # rather than inside f_phi), half an fp32 x's bytes.
            low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
            z = checkpoint(self._f_phi, x.to(low), self.repo_kernels, use_reentrant=False)
        else:
            z = self._f_phi(x, self.repo_kernels)
        return self.positions_out(z)

    def apply_positions(
        self,
        q: Tensor,
        k: Tensor,
        positions: Tensor,
        *,
        tokens_first: bool = False,
        compiled: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        """q [..., H, T, d_head] and k [..., H_kv, T, d_head] rotated by positions [..., H_kv, T], each key/value
        head's position shared by its H / H_kv query heads; YaRN's attention factor applied. `tokens_first`:
        q and k are [..., T, H, d_head] (vLLM's packed tokens). `nope` layers: q and k as they are.

        Differentiable, positions included. On CUDA RePo's rotation kernel (`olmo_repo.kernels.rotate_qk`,
        `repo_kernels`) where its variant passed its check; else `rotate_qk` (`compiled`: through torch.compile, by
        default on CUDA) and, without autograd, `rotate_forward`, which torch.compile (vLLM's) can trace.
        """
        if self.pe_mode != PositionMode.repo:
            return q, k
        inv_freq, scale = self.rope_frequencies(q.device)
        kernels = _kernels(self.repo_kernels, q, k, positions)
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or positions.requires_grad)
        if kernels is not None and kernels.rotation_ready(q, k, positions, tokens_first, grad):
            return kernels.rotate_qk(q, k, positions, inv_freq, scale, tokens_first=tokens_first)
        heads = -2 if tokens_first else -3  # the heads dim of q and k
        n_kv = positions.shape[-2]
        # [..., T, H_kv, 1] or [..., H_kv, 1, T]: broadcast over the query heads of a group.
        z = positions.transpose(-1, -2).unsqueeze(-1) if tokens_first else positions.unsqueeze(-2)
        q, k = q.unflatten(heads, (n_kv, -1)), k.unflatten(heads, (n_kv, -1))  # H -> (H_kv, group)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or z.requires_grad):
            q, k = rotate_qk(q, k, z, inv_freq, compiled=compiled)
        else:
            q, k = rotate_forward(z, inv_freq, [q, k])
        q, k = q.flatten(heads - 1, heads), k.flatten(heads - 1, heads)
        if scale != 1.0:  # YaRN's attention factor, which RoPE layers apply to cos/sin
            q, k = q * scale, k * scale
        return q, k

    def rotation_positions(self, x: Tensor, index: Tensor | None) -> Tensor | None:
        """What a `repo` layer rotates q and k by, [..., H_kv, T] fp32, or None for no rotation:

        - learned: f_phi's positions z from x [..., T, d_model] (observed at `positions_out`), blended with the
          token index i [..., T] as (1 - p) z + p i, p = `index_blend` (`blend_positions`);
        - index (an ablation at evaluation): i itself, the RoPE layer this one replaced;
        - constant (an ablation at evaluation): None, no rotation (NoPE).

        `index`: each token's absolute index (after a KV cache's past, as RoPE counts it), any shape that
        broadcasts to [..., T]; needed only for p > 0 or `index`.
        """
        if self.position_source == PositionSource.constant:
            return None
        if self.position_source == PositionSource.index:
            assert index is not None, "position_source=index rotates by the token index: pass index"
            return _heads(index, len(self.f_phi_rows)).float()
        return blend_positions(self.predict_positions(x), index, self.index_blend)

    def reposition(
        self, x: Tensor, q: Tensor, k: Tensor, *, index: Tensor | None = None, tokens_first: bool = False
    ) -> tuple[Tensor, Tensor]:
        """`apply_positions` with `rotation_positions(x, index)` (repo), or none (nope)."""
        if self.pe_mode != PositionMode.repo:
            return q, k
        positions = self.rotation_positions(x, index)
        if positions is None:
            return q, k
        return self.apply_positions(q, k, positions, tokens_first=tokens_first)

    def load_f_phi(self, param: Tensor, loaded: Tensor) -> None:
        """Copy a checkpoint's f_phi weight into `param`; of final_map [H_kv, d_model // 8] only `f_phi_rows`."""
        if param is self.final_map.weight:
            check_final_map_rows(loaded.shape[0], self.repo_n_kv_heads, "final_map.weight")
            loaded = loaded[self.f_phi_rows.start : self.f_phi_rows.stop]
        param.data.copy_(loaded)


def _heads(index: Tensor, n_kv_heads: int) -> Tensor:
    """A token index [..., T] as positions of every key/value head, [..., H_kv, T]."""
    index = index.unsqueeze(-2)
    return index.expand(*index.shape[:-2], n_kv_heads, index.shape[-1])


def blend_positions(z: Tensor, index: Tensor | None, p: float) -> Tensor:
    """The index blend: (1 - p) z + p i for positions z [..., H_kv, T] (fp32) and the token index i [..., T].

    p = 0 returns z itself (the paper's RePo, no work); p = 1 gives i exactly (0 * z + i, z finite), so a
    RePo layer then rotates as the RoPE layer it replaced, bit for bit in fp32. The gradient into z is
    (1 - p) of the incoming one.
    """
    if p == 0.0:
        return z
    assert index is not None, "an index blend (p > 0) needs each token's index: pass index"
    return (1.0 - p) * z + p * index.to(z.dtype).unsqueeze(-2)


def set_kernels(model: nn.Module, where: str | None) -> None:
    """Where every RePo layer of `model` (wrapped or not) runs RePo's kernels (`KERNELS`): set before the model
    runs, read by each forward (and by an activation checkpoint's recomputation, as its forward did)."""
    if where not in KERNELS:
        raise ValueError(f"kernels={where!r}: one of {', '.join(map(repr, KERNELS))}")
    for layer in repo_layers(model):
        layer.repo_kernels = where


def set_index_blend(model: nn.Module, p: float) -> None:
    """Set the index blend p of every RePo layer of `model` (wrapped or not): the trainers call it before each
    step with `modes.index_blend(init, steps, steps done)`."""
    for layer in repo_layers(model):
        layer.index_blend = float(p)


def check_final_map_rows(rows: int, n_kv_heads: int, key: str) -> None:
    """A checkpoint's final_map must predict one position per key/value head: ValueError naming `key` and the
    sizes otherwise (a multi-head checkpoint in a grouped model, or the other way round)."""
    if rows != n_kv_heads:
        raise ValueError(
            f"{key} predicts {rows} positions per token, but this model has {n_kv_heads} key/value heads (one "
            "position each): the checkpoint and the config are of different models"
        )


def _check_loaded_f_phi(layer: RepoLayer, state_dict: dict[str, Tensor], prefix: str, *args: object) -> None:
    """`load_state_dict`'s pre-hook of a RePo layer: one clear line instead of a size-mismatch listing."""
    if (loaded := state_dict.get(prefix + "final_map.weight")) is not None:
        check_final_map_rows(loaded.shape[0], layer.repo_n_kv_heads, prefix + "final_map.weight")


def repo_layers(model: nn.Module) -> list[RepoLayer]:
    """The layers of `model` (wrapped or not) that predict positions, in module order."""
    return [m for m in model.modules() if isinstance(m, RepoLayer) and m.pe_mode == PositionMode.repo]


@contextmanager
def observe_positions(model: nn.Module, observe: Callable[[int, Tensor], None]) -> Iterator[None]:
    """Call observe(layer id, positions [..., H_kv, T]) whenever a RePo layer of `model` predicts positions
    (also in an activation checkpoint's recomputation) while the block runs."""
    hooks = [
        layer.positions_out.register_forward_hook(lambda _m, _args, out, i=layer.layer_id: observe(i, out))
        for layer in repo_layers(model)
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@contextmanager
def record_positions(model: nn.Module) -> Iterator[dict[int, Tensor]]:
    """Collect {layer id: positions [..., H_kv, T]} of every RePo layer of `model` while the block runs (the
    last call of each layer)."""
    positions: dict[int, Tensor] = {}
    with observe_positions(model, positions.__setitem__):
        yield positions


@contextmanager
def position_stats(model: nn.Module) -> Iterator[dict[str, float]]:
    """The training metrics of the positions (`modes.POSITIONS_METRIC` with each of `modes.POSITION_STATS` per
    RePo layer; `modes.INDEX_BLEND_METRIC` while a blend is on) of the first forward of each RePo layer of
    `model` while the block runs: the first micro-batch of a step, later ones and activation-checkpoint
    recomputations left out. A tensor-parallel layer's positions are gathered first. Both trainers log these,
    one rule for what they mean."""
    stats: dict[str, float] = {}
    layers = repo_layers(model)
    if layers and layers[0].index_blend > 0:
        stats[INDEX_BLEND_METRIC] = layers[0].index_blend

    def record(layer: int, z: Tensor) -> None:  # z [B, H_kv, T]
        key = lambda stat: POSITIONS_METRIC.format(layer=layer, stat=stat)  # noqa: E731
        if key("std") in stats:
            return
        z = (z.full_tensor() if hasattr(z, "full_tensor") else z).detach().float()  # DTensor under TP
        stats.update({key(stat): value for stat, value in spread(z).items()})

    with observe_positions(model, record):
        yield stats


def spread(z: Tensor) -> dict[str, float]:
    """`modes.POSITION_STATS` of positions z [..., T]: min, max, std, 5th and 95th percentile of every value,
    and Spearman's rank correlation of each row with the token index 0..T-1, averaged over the rows (a row
    of equal values counts 0)."""
    z = z.detach().float()
    flat = z.flatten()
    if flat.numel() > 1 << 24:  # torch.quantile's limit: an even subsample
        flat = flat[:: flat.numel() // (1 << 24) + 1]
    p05, p95 = torch.quantile(flat, torch.tensor([0.05, 0.95], device=flat.device)).tolist()
    rows = z.reshape(-1, z.shape[-1])  # [rows, T]
    ranks = rows.argsort(-1).argsort(-1).float()
    ranks = ranks - ranks.mean(-1, keepdim=True)
    steps = torch.arange(rows.shape[-1], device=z.device, dtype=torch.float32)
    steps = steps - steps.mean()
    denom = ranks.norm(dim=-1) * steps.norm()
    corr = torch.where(denom > 0, (ranks * steps).sum(-1) / denom.clamp_min(1e-30), 0.0)
    constant = rows.amax(-1) == rows.amin(-1)  # argsort ranks ties in index order: not an ordering
    corr = torch.where(constant, 0.0, corr)
    return {
        "min": z.min().item(),
        "max": z.max().item(),
        "std": z.std().item() if z.numel() > 1 else 0.0,
        "p05": p05,
        "p95": p95,
        "rank_corr": corr.mean().item(),
    }


def rank_kv_heads(n_kv_heads: int, tp_size: int, tp_rank: int) -> range:
    """The key/value heads (and so the positions) that tensor-parallel rank `tp_rank` of `tp_size` holds: the
    heads split evenly over the ranks, or, with fewer heads than ranks, each head replicated over
    tp_size / n_kv_heads consecutive ranks (vLLM's layout; OLMo-core's is the even split)."""
    per_rank = max(1, n_kv_heads // tp_size)
    first = (tp_rank // max(1, tp_size // n_kv_heads)) * per_rank
    return range(first, first + per_rank)
