"""The rotation of q and k at real per-(token, key/value head) positions, forward and backward, in Triton.

The math is `olmo_repo.rotation`'s (its docstring derives it; its torch code is the reference and the CPU path): pair
k < d/2 of a head (split halves: element k with element k + d/2) turns by angle_k = z * inv_freq_k, and YaRN's
attention factor s multiplies the result, as `RepoLayer.apply_positions` applies it:

    out    = s (x1 cos - x2 sin, x2 cos + x1 sin)
    dL/dx  = s (g1 cos + g2 sin, g2 cos - g1 sin)               # s R^T g
    dL/dz  = sum_k inv_freq_k (g2_k out1_k - g1_k out2_k)       # s cancels: out holds it

One rule: the positions arrive final. What is rotated by (f_phi's z, the index blend (1 - p) z + p i with the
absolute index after a KV cache's past, the index or nothing at evaluation) is decided once, in
`rope.RepoLayer.rotation_positions` and `rope.blend_positions`; nothing here knows of it.

One program per (batch row, key/value head, block of tokens) computes the angles in fp32 from the positions and
the inverse frequencies with `tl.sin`/`tl.cos` (libdevice's precise sinf/cosf on NVIDIA: no tables, no fast
math), then turns the key/value head's query group and its key with them, so each cos/sin is computed once per
group. Arithmetic is fp32 whatever q and k are (bf16, fp16, fp32); FP fusion is off, so products and sums round
as the reference's separate ops do. The backward sums dL/dz over the group's query heads and the key in
registers (no atomics: deterministic) and needs only the positions and the rotated q and k, which attention
keeps anyway (as `rotation._Rotate` saves). Head sizes whose half is not a power of two (80, 96, 112) are masked.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import select

__all__ = ["ready", "rotate_qk"]

TILE = 2048
"""Elements of a program's [tokens, d/2] tile: tokens per program = TILE / the next power of two of d/2."""
OPTIONS = {"enable_fp_fusion": False}
"""Compile options of every launch (and of the sm_90 compile test): products and sums round separately."""


@triton.jit
def _angles(z_ptr, f_ptr, rows, cols, T, half, z_st):
    """cos, sin [BLOCK_T, BLOCK_D] of z[rows] * inv_freq[cols], fp32, and inv_freq [BLOCK_D] (0 past d/2)."""
    z = tl.load(z_ptr + rows * z_st, mask=rows < T, other=0.0).to(tl.float32)
    f = tl.load(f_ptr + cols, mask=cols < half, other=0.0)
    angle = z[:, None] * f[None, :]
    return tl.cos(angle), tl.sin(angle), f


@triton.jit
def _turn(x_ptr, o_ptr, rows, cols, mask, cos, sin, scale, half, x_st, o_st):
    """One head's tokens `rows`: x (token stride x_st, dims contiguous) rotated and scaled into o."""
    x = x_ptr + rows[:, None] * x_st + cols[None, :]
    x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + half, mask=mask, other=0.0).to(tl.float32)
    o = o_ptr + rows[:, None] * o_st + cols[None, :]
    tl.store(o, ((x1 * cos - x2 * sin) * scale).to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o + half, ((x2 * cos + x1 * sin) * scale).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _turn_back(
    g_ptr, o_ptr, d_ptr, rows, cols, mask, cos, sin, scale, half, g_st, o_st, d_st,
    NEED_DX: tl.constexpr, NEED_DZ: tl.constexpr,
):  # fmt: skip
    """One head's backward: R^T g (scaled) into d if NEED_DX; returns its dL/dz terms g2 o1 - g1 o2 per pair."""
    g = g_ptr + rows[:, None] * g_st + cols[None, :]
    g1 = tl.load(g, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(g + half, mask=mask, other=0.0).to(tl.float32)
    if NEED_DX:
        d = d_ptr + rows[:, None] * d_st + cols[None, :]
        tl.store(d, ((g1 * cos + g2 * sin) * scale).to(d_ptr.dtype.element_ty), mask=mask)
        tl.store(d + half, ((g2 * cos - g1 * sin) * scale).to(d_ptr.dtype.element_ty), mask=mask)
    term = tl.zeros_like(g1)
    if NEED_DZ:
        o = o_ptr + rows[:, None] * o_st + cols[None, :]
        o1 = tl.load(o, mask=mask, other=0.0).to(tl.float32)
        o2 = tl.load(o + half, mask=mask, other=0.0).to(tl.float32)
        term = g2 * o1 - g1 * o2
    return term


@triton.jit
def _program(n_kv, T, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's batch row b and key/value head h (int64), its tokens and the pair indices."""
    pid = tl.program_id(0)
    blocks = tl.cdiv(T, BLOCK_T)
    bh = pid // blocks
    rows = (pid % blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    return (bh // n_kv).to(tl.int64), (bh % n_kv).to(tl.int64), rows.to(tl.int64), tl.arange(0, BLOCK_D)


@triton.jit
def rotate_fwd(
    z_ptr, f_ptr, q_ptr, k_ptr, oq_ptr, ok_ptr, T, n_kv, group, half, scale,
    z_sb, z_sh, z_st, q_sb, q_sh, q_st, k_sb, k_sh, k_st, oq_sb, oq_sh, oq_st, ok_sb, ok_sh, ok_st,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """q [B, n_kv * group, T, d] and k [B, n_kv, T, d] (strides given, dims contiguous) rotated by z [B, n_kv, T]
    into oq, ok."""
    b, h, rows, cols = _program(n_kv, T, BLOCK_T, BLOCK_D)
    mask = (rows < T)[:, None] & (cols < half)[None, :]
    cos, sin, _ = _angles(z_ptr + b * z_sb + h * z_sh, f_ptr, rows, cols, T, half, z_st)
    for j in range(group):
        head = h * group + j
        _turn(
            q_ptr + b * q_sb + head * q_sh, oq_ptr + b * oq_sb + head * oq_sh,
            rows, cols, mask, cos, sin, scale, half, q_st, oq_st,
        )  # fmt: skip
    _turn(
        k_ptr + b * k_sb + h * k_sh, ok_ptr + b * ok_sb + h * ok_sh,
        rows, cols, mask, cos, sin, scale, half, k_st, ok_st,
    )  # fmt: skip


@triton.jit
def rotate_bwd(
    z_ptr, f_ptr, gq_ptr, oq_ptr, dq_ptr, gk_ptr, ok_ptr, dk_ptr, dz_ptr, T, n_kv, group, half, scale,
    z_sb, z_sh, z_st, gq_sb, gq_sh, gq_st, oq_sb, oq_sh, oq_st, dq_sb, dq_sh, dq_st,
    gk_sb, gk_sh, gk_st, ok_sb, ok_sh, ok_st, dk_sb, dk_sh, dk_st,
    NEED_DQ: tl.constexpr, NEED_DK: tl.constexpr, NEED_DZ: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The gradients of q, k (where asked) and z [B, n_kv, T] (contiguous, summed over the group's query heads and
    the key) from those of the rotated oq, ok (gq, gk)."""
    b, h, rows, cols = _program(n_kv, T, BLOCK_T, BLOCK_D)
    mask = (rows < T)[:, None] & (cols < half)[None, :]
    cos, sin, f = _angles(z_ptr + b * z_sb + h * z_sh, f_ptr, rows, cols, T, half, z_st)
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for j in range(group):
        head = h * group + j
        acc += _turn_back(
            gq_ptr + b * gq_sb + head * gq_sh, oq_ptr + b * oq_sb + head * oq_sh,
            dq_ptr + b * dq_sb + head * dq_sh, rows, cols, mask, cos, sin, scale, half, gq_st, oq_st, dq_st,
            NEED_DQ, NEED_DZ,
        )  # fmt: skip
    acc += _turn_back(
        gk_ptr + b * gk_sb + h * gk_sh, ok_ptr + b * ok_sb + h * ok_sh, dk_ptr + b * dk_sb + h * dk_sh,
        rows, cols, mask, cos, sin, scale, half, gk_st, ok_st, dk_st, NEED_DK, NEED_DZ,
    )  # fmt: skip
    if NEED_DZ:
        tl.store(dz_ptr + (b * n_kv + h) * T + rows, tl.sum(acc * f[None, :], axis=1), mask=rows < T)


def _bhtd(x: Tensor, tokens_first: bool) -> Tensor:
    """x [..., H, T, d] (tokens_first: [..., T, H, d]) as [B, H, T, d], a view of x where its leading dims
    flatten to one without copying."""
    x = x.reshape(-1, *x.shape[-3:])
    return x.transpose(1, 2) if tokens_first else x


def _strides(x: Tensor) -> tuple[int, int, int]:
    """Batch, head and token strides of a [B, H, T, d] view whose last dim is contiguous."""
    assert x.stride(-1) == 1 or x.shape[-1] == 1, "the head dim must be contiguous"
    return x.stride(0), x.stride(1), x.stride(2)


def _launch_shape(T: int, d: int, B: int, n_kv: int) -> dict:
    """The grid (one program per batch row, key/value head and block of tokens) and the blocks of a launch."""
    block_d = triton.next_power_of_2(d // 2)
    block_t = min(triton.next_power_of_2(max(T, 1)), max(1, TILE // block_d))
    return {"grid": (B * n_kv * triton.cdiv(T, block_t),), "BLOCK_T": block_t, "BLOCK_D": block_d}


def _positions(positions: Tensor, lead: torch.Size) -> Tensor:
    """positions [..., H_kv, T] broadcast to x's leading dims and flattened: [B, H_kv, T] (stride 0 where
    broadcast)."""
    return positions.expand(*lead, *positions.shape[-2:]).reshape(-1, *positions.shape[-2:])


def _unit_stride(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _forward(
    positions: Tensor, inv_freq: Tensor, scale: float, tokens_first: bool, q: Tensor, k: Tensor
) -> tuple[Tensor, Tensor]:
    """`rotate_qk` without autograd: new tensors of q's and k's shapes, dtypes and layouts in memory (attention's
    output then follows q's layout, as after a RoPE layer: no copy for the output projection)."""
    q, k = _unit_stride(q), _unit_stride(k)
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    qv, kv, oqv, okv = (_bhtd(x, tokens_first) for x in (q, k, oq, ok))
    B, H, T, d = qv.shape
    z = _positions(positions, q.shape[:-3])  # [B, H_kv, T]
    n_kv = z.shape[-2]
    assert H % n_kv == 0 and kv.shape[1] == n_kv and kv.shape[2] == T, "q, k and positions do not fit"
    if qv.numel() and kv.numel():
        launch = _launch_shape(T, d, B, n_kv)
        rotate_fwd[launch.pop("grid")](
            z, inv_freq, qv, kv, oqv, okv, T, n_kv, H // n_kv, d // 2, float(scale),
            *z.stride(), *_strides(qv), *_strides(kv), *_strides(oqv), *_strides(okv), **launch, **OPTIONS,
        )  # fmt: skip
    return oq, ok


def _as_output(g: Tensor, o: Tensor) -> Tensor:
    """The gradient g of output o in o's layout as Triton's specialisation sees it (`select.layout`), copied into
    it where it is not: the backward then runs the variant that `ready` checked."""
    if g.stride() == o.stride() or select.layout(g) == select.layout(o):
        return g
    return torch.empty_like(o).copy_(g)


def _backward(
    positions: Tensor,
    inv_freq: Tensor,
    scale: float,
    tokens_first: bool,
    oq: Tensor,
    ok: Tensor,
    gq: Tensor,
    gk: Tensor,
    need: tuple[bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of the positions, q and k (None where `need`, in that order, says no) from gq and gk, those of
    the rotated oq and ok."""
    need_pos, need_q, need_k = need
    gq, gk = _as_output(gq, oq), _as_output(gk, ok)
    z = _positions(positions, oq.shape[:-3])  # [B, H_kv, T]
    dz = torch.empty(z.shape, dtype=torch.float32, device=z.device) if need_pos else z
    # The outputs stand in for an unasked gradient's result (never written: NEED_DQ/NEED_DK off).
    dq = torch.empty(oq.shape, dtype=gq.dtype, device=oq.device) if need_q else oq
    dk = torch.empty(ok.shape, dtype=gk.dtype, device=ok.device) if need_k else ok
    gqv, oqv, dqv, gkv, okv, dkv = (_bhtd(x, tokens_first) for x in (gq, oq, dq, gk, ok, dk))
    B, H, T, d = oqv.shape
    n_kv = z.shape[-2]
    if oqv.numel() and okv.numel():
        launch = _launch_shape(T, d, B, n_kv)
        rotate_bwd[launch.pop("grid")](
            z, inv_freq, gqv, oqv, dqv, gkv, okv, dkv, dz, T, n_kv, H // n_kv, d // 2, float(scale),
            *z.stride(), *_strides(gqv), *_strides(oqv), *_strides(dqv),
            *_strides(gkv), *_strides(okv), *_strides(dkv),
            NEED_DQ=need_q, NEED_DK=need_k, NEED_DZ=need_pos, **launch, **OPTIONS,
        )  # fmt: skip
    elif need_pos:
        dz.zero_()
    grad_pos = None
    if need_pos:  # summed over what the positions were broadcast to (batch rows that share them)
        grad_pos = dz.reshape(*oq.shape[:-3], n_kv, T).sum_to_size(positions.shape).to(positions.dtype)
    return grad_pos, dq if need_q else None, dk if need_k else None


class _RotateQK(torch.autograd.Function):
    """`rotate_qk` with autograd: saves the positions and the rotated q and k, nothing else. An output without a
    gradient gets zeros (autograd's default): one backward variant per set of inputs that need one."""

    @staticmethod
    def forward(ctx, positions, inv_freq, scale, tokens_first, q, k):  # type: ignore[override]
        oq, ok = _forward(positions, inv_freq, scale, tokens_first, q, k)
        ctx.scale, ctx.tokens_first = scale, tokens_first
        ctx.save_for_backward(positions, inv_freq, oq, ok)
        return oq, ok

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gq: Tensor, gk: Tensor):  # type: ignore[override]
        positions, inv_freq, oq, ok = ctx.saved_tensors
        need_pos, _, _, _, need_q, need_k = ctx.needs_input_grad
        grads = _backward(
            positions, inv_freq, ctx.scale, ctx.tokens_first, oq, ok, gq, gk, (need_pos, need_q, need_k)
        )
        return grads[0], None, None, None, grads[1], grads[2]


def rotate_qk(
    q: Tensor,
    k: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    scale: float = 1.0,
    *,
    tokens_first: bool = False,
) -> tuple[Tensor, Tensor]:
    """q [..., H, T, d] and k [..., H_kv, T, d] (tokens_first: [..., T, H, d] and [..., T, H_kv, d]) rotated by
    positions [..., H_kv, T] (leading dims broadcast to q's), each key/value head's position shared by its H / H_kv
    query heads, and multiplied by `scale` (YaRN's attention factor); inv_freq [d/2] fp32. Returns new tensors of
    q's and k's shapes, dtypes and layouts in memory; differentiable in q, k and the positions where any needs it."""
    inv_freq = inv_freq.float().contiguous()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or positions.requires_grad):
        return _RotateQK.apply(positions, inv_freq, scale, tokens_first, q, k)
    return _forward(positions, inv_freq, scale, tokens_first, q, k)


# ------------------------------------------------------------------------ the check before a variant first runs


def _heads_tokens(x: Tensor, tokens_first: bool) -> tuple[int, int]:
    """(heads, tokens) of q or k."""
    return (x.shape[-2], x.shape[-3]) if tokens_first else (x.shape[-3], x.shape[-2])


def ready(q: Tensor, k: Tensor, positions: Tensor, tokens_first: bool, grad: bool) -> bool:
    """Whether `rotate_qk` may run on these inputs here (`select.verdict`): its forward and, with `grad`, its
    backward at this specialisation (q's and k's dtypes and layouts, head size, key/value heads, group, Triton's
    class of the length, the blocks `_launch_shape` picks, which inputs need a gradient) checked on this device."""
    needs = (positions.requires_grad, q.requires_grad, k.requires_grad) if grad else None
    call = (
        q.device, q.dtype, k.dtype, q.shape, q.stride(), k.shape, k.stride(), positions.shape, positions.stride(),
        q.data_ptr() % 16, k.data_ptr() % 16, positions.data_ptr() % 16, tokens_first, needs,
    )  # fmt: skip
    return select.remembered(call, lambda: _verdict(q, k, positions, tokens_first, needs))


def _verdict(q: Tensor, k: Tensor, positions: Tensor, tokens_first: bool, needs: tuple | None) -> bool:
    H, T = _heads_tokens(q, tokens_first)
    d, n_kv = q.shape[-1], positions.shape[-2]
    launch = _launch_shape(T, d, 1, n_kv)
    key = (
        q.device, "rotation", q.dtype, k.dtype, d, n_kv, H // n_kv, tokens_first, select.int_class(T),
        launch["BLOCK_T"], launch["BLOCK_D"], select.layout(q), select.layout(k), select.layout(positions), needs,
    )  # fmt: skip
    check = functools.partial(_check, q, k, positions, tokens_first, needs)

    def describe() -> str:
        asked = ", backward of " + "".join(n for n, need in zip("zqk", needs) if need) if needs else ""
        return (
            f"rotation ({str(q.dtype)[6:]} q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"{'tokens first, ' if tokens_first else ''}head size {d}, {n_kv} key/value heads of {H // n_kv} "
            f"query heads, blocks {launch['BLOCK_T']} x {launch['BLOCK_D']}{asked})"
        )

    return select.verdict(key, check, describe)


def _rotated64(x: Tensor, z: Tensor, inv_freq: Tensor, scale: float, tokens_first: bool):
    """x rotated by z and scaled, in float64, as [B, H, T, d]; and each element's fp32 rounding count (the angle's
    |z f| and 6 more: cos/sin, two products, a sum, the scale) and magnitude s (|x1| + |x2|)."""
    xv = _bhtd(x, tokens_first).double()
    group = xv.shape[1] // z.shape[-2]
    zq = _positions(z, x.shape[:-3]).double().repeat_interleave(group, dim=1)  # [B, H, T]
    angle = zq.unsqueeze(-1) * inv_freq.double()  # [B, H, T, d/2]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = xv.chunk(2, dim=-1)
    out = scale * torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    magnitude = scale * (x1.abs() + x2.abs()).repeat(1, 1, 1, 2)
    return out, angle.abs().repeat(1, 1, 1, 2) + 6, magnitude


def _dz64(g: Tensor, o: Tensor, n_kv: int, inv_freq: Tensor, tokens_first: bool) -> tuple[Tensor, Tensor]:
    """sum over the group's heads and the pairs of f (g2 o1 - g1 o2), float64 [B, n_kv, T], and the same sum of the
    terms' magnitudes."""
    g1, g2 = _bhtd(g, tokens_first).double().chunk(2, dim=-1)
    o1, o2 = _bhtd(o, tokens_first).double().chunk(2, dim=-1)
    f = inv_freq.double()
    terms, sizes = ((g2 * o1 - g1 * o2) * f).sum(-1), ((g2 * o1).abs() + (g1 * o2).abs()).mul(f).sum(-1)
    return terms.unflatten(1, (n_kv, -1)).sum(2), sizes.unflatten(1, (n_kv, -1)).sum(2)


def _check(
    q: Tensor, k: Tensor, positions: Tensor, tokens_first: bool, needs: tuple[bool, bool, bool] | None
) -> list[select.Agreement]:
    """The kernels on inputs `select.alike` q, k and the positions (at most 2 batch rows, `select.check_length`
    tokens), YaRN's factor 1.25, against float64: the forward, and the backward where `needs`."""
    gen = torch.Generator().manual_seed(0)
    H, T = _heads_tokens(q, tokens_first)
    d, n_kv = q.shape[-1], positions.shape[-2]
    T = select.check_length(T, _launch_shape(T, d, 1, n_kv)["BLOCK_T"])

    def sizes(x: Tensor, heads: int) -> list[int]:
        return [min(n, 2) for n in x.shape[:-3]] + ([T, heads, d] if tokens_first else [heads, T, d])

    qc, kc = select.alike(q, sizes(q, H), gen), select.alike(k, sizes(k, n_kv), gen)
    zc = select.alike(positions, [min(n, 2) for n in positions.shape[:-2]] + [n_kv, T], gen, std=100.0)
    inv_freq = (10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)).to(q.device)
    scale = 1.25
    oq, ok = _forward(zc, inv_freq, scale, tokens_first, qc, kc)
    found = []
    for what, x, o in (("q", qc, oq), ("k", kc, ok)):
        truth, roundings, magnitude = _rotated64(x, zc, inv_freq, scale, tokens_first)
        found.append(select.agreement(f"rotated {what}", _bhtd(o, tokens_first), truth, roundings, magnitude))
    if needs is None:
        return found
    gq, gk = select.alike(oq, oq.shape, gen), select.alike(ok, ok.shape, gen)
    dz, dq, dk = _backward(zc, inv_freq, scale, tokens_first, oq, ok, gq, gk, needs)
    for what, g, grad in (("dL/dq", gq, dq), ("dL/dk", gk, dk)):
        if grad is not None:  # R^T g = g rotated by -z
            truth, roundings, magnitude = _rotated64(g, -zc, inv_freq, scale, tokens_first)
            found.append(select.agreement(what, _bhtd(grad, tokens_first), truth, roundings, magnitude))
    if dz is not None:
        (tq, mq), (tk, mk) = (_dz64(g, o, n_kv, inv_freq, tokens_first) for g, o in ((gq, oq), (gk, ok)))
        as_z = lambda t: t.reshape(*oq.shape[:-3], n_kv, T).sum_to_size(zc.shape)  # noqa: E731
        # (group + 1) x d/2 terms summed in any order, each a difference of two products times f: 3 roundings.
        roundings = (H // n_kv + 1) * d // 2 + 3
        found.append(select.agreement("dL/dz", dz, as_z(tq + tk), roundings, as_z(mq + mk)))
    return found
