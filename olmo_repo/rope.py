"""The RePo math and the layer, torch only: f_phi (the positions), the index blend, and `RepoLayer`.

Every backend (the OLMo block, the Hugging Face and vLLM attentions, the OLMo-core attention) mixes
`RepoLayer` into the module that owns q and k, and keeps only its own plumbing (cache, bias channel, dtype
policy). This file also travels into converted Hugging Face checkpoints as remote code (with `rotation.py` and
`modes.py`): keep it torch-only.

f_phi maps a layer's input x [..., T, d_model] to one real position per key/value head and token,

    z = final_map( SiLU(gate_map(x)) * content_map(x) )        # [..., T, H_kv] -> [..., H_kv, T]

with fp32 results, so that large positions are not quantised by bf16 (the reference rounds them to a step of
16 near 4096). gate_map and content_map (d_model -> d_model // 8, `modes.F_PHI_HIDDEN_RATIO`) take their
inputs at the model's compute precision, like every other projection, but accumulate and return fp32: a
product of two bf16 numbers is exact in fp32, so this equals fp32 math on those inputs, at bf16 GEMM speed
on a GPU. The product and final_map run in fp32. With grouped-query attention the query heads of a group
share their key/value head's position, so the score of query head h in group g is q_i^T R(z_j^g - z_i^g) k_j
and the KV cache keeps its grouped size; with n_kv_heads == n_heads this is the paper's one position per head.

q and k are rotated by these positions as RoPE rotates by token indices (`olmo_repo.rotation`, which derives
the rotation and its gradient); YaRN's attention factor multiplies the rotated q and k, as stock RoPE layers
apply it to cos/sin.

On CUDA, f_phi and the rotation run RePo's own Triton kernels (`olmo_repo.kernels`: gate_map and content_map as
one GEMM with fp32 output, SiLU, product and final_map in one pass; the rotation of a key/value head's query
group and key in one pass per direction), where `olmo_repo.kernels.select` picks them (`set_kernels`,
`OLMO_REPO_KERNELS`; each variant checked on its device first). The torch code here and in `rotation.py` is
their reference and runs everywhere else: on CPU, for float64 and tensor-parallel (DTensor) weights, inside
torch.compile's tracing (which fuses it: vLLM's compiled model), and where Triton or the kernels are absent (a
converted checkpoint's remote code carries this file without them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.torch_version import TorchVersion
from torch.utils.checkpoint import checkpoint

from .modes import F_PHI_HIDDEN_RATIO, F_PHI_WEIGHTS, PositionMode, PositionSource
from .rotation import inv_frequencies, no_autocast, rotate_forward, rotate_qk

__all__ = [
    "LinearFp32Out",
    "RepoLayer",
    "blend_positions",
    "check_final_map_rows",
    "f_phi",
    "observe_positions",
    "rank_kv_heads",
    "record_positions",
    "repo_layers",
    "set_index_blend",
    "set_kernels",
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
    with no_autocast(device):
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
"""Where a RePo layer runs RePo's kernels (`RepoLayer.repo_kernels`, `set_kernels`; `olmo_repo.kernels.select`
says what each means): None as `OLMO_REPO_KERNELS` says, "torch" nowhere, "kernels" on every device."""


def _kernels(where: str | None, *tensors: Tensor) -> ModuleType | None:
    """`olmo_repo.kernels` where `kernels.select.runs` picks them for these tensors, else None: the torch code
    runs. Whether a kernel's variant then runs is the kernel module's `ready`."""
    if where == "torch" or (where is None and not tensors[0].is_cuda) or _compiling():
        # Decided before the import: remote code may have no kernels, a CPU run needs none (nor Triton's import),
        # and a graph being traced must not break (vLLM traces its model whole).
        return None
    kernels = _import_kernels()
    return kernels if kernels is not None and kernels.select.runs(where, *tensors) else None


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


# torch.mm(..., out_dtype) (the `aten::mm.dtype` overload) is torch 2.8's; converted checkpoints may meet an older
# torch (then: fp32 copies).
_MM_HAS_OUT_DTYPE = TorchVersion(torch.__version__) >= (2, 8)


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


# ------------------------------------------------------------------------------------------ the RePo layer


class RepoLayer:
    """The RePo part of the module that owns a layer's q and k, as a mixin.

    The owner (`olmo_repo.ai2olmo.block.RepoSequentialBlock`, the HF and vLLM `RepoOlmo2Attention`, the OLMo-core
    attention) calls `init_repo` in its own `__init__`, after its stock module's, which sets every attribute below;
    then `predict_positions(x)` and `apply_positions(q, k, positions)` (or both at once: `reposition`) where its
    stock code applies RoPE. In `repo` mode `init_repo` adds f_phi's weights as the owner's own children
    (`<owner>.gate_map.weight`, ...: the state-dict names of every checkpoint) and `positions_out`, the one place
    where positions are observed (`observe_positions`). `nope` layers rotate nothing. Stock RoPE layers are not
    `RepoLayer`s (vLLM's attention is one in every layer, and runs its stock forward in `rope` ones).
    """

    pe_mode: PositionMode
    layer_id: int
    index_blend: float
    """p of the index blend (`modes.PositionKeys`): q and k are rotated by (1 - p) z + p i. The trainers set it
    every step (`set_index_blend`); HF and vLLM from the config's `pe_blend`."""
    position_source: PositionSource
    """What q and k are rotated by (`modes.PositionSource`): f_phi's positions, or, as an ablation at
    evaluation, the token index or one constant position."""
    repo_kernels: str | None
    """Where this layer runs RePo's kernels (`KERNELS`, `set_kernels`); None: as `OLMO_REPO_KERNELS` says."""
    repo_n_kv_heads: int
    """The model's key/value heads: the rows of a checkpoint's final_map."""
    f_phi_rows: range
    """The rows of final_map (key/value heads) this module holds: all of them, or a tensor-parallel slice."""
    repo_head_dim: int
    repo_rope_theta: float | None
    """With `repo_head_dim`, stock RoPE's frequencies (`rope_frequencies`); None where a backend overrides it."""

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
        self.repo_kernels = None
        self.repo_n_kv_heads = n_kv_heads
        self.f_phi_rows = range(n_kv_heads) if kv_heads is None else kv_heads
        self.repo_head_dim, self.repo_rope_theta = head_dim, rope_theta
        if self.pe_mode != PositionMode.repo:
            return
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


def rank_kv_heads(n_kv_heads: int, tp_size: int, tp_rank: int) -> range:
    """The key/value heads (and so the positions) that tensor-parallel rank `tp_rank` of `tp_size` holds: the
    heads split evenly over the ranks, or, with fewer heads than ranks, each head replicated over
    tp_size / n_kv_heads consecutive ranks (vLLM's layout; OLMo-core's is the even split)."""
    per_rank = max(1, n_kv_heads // tp_size)
    first = (tp_rank // max(1, tp_size // n_kv_heads)) * per_rank
    return range(first, first + per_rank)
