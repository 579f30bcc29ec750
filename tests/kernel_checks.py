"""RePo's Triton kernels (`olmo_repo.kernels`) against a float64 oracle and the torch reference of
`olmo_repo.rope`, forward and backward: grouped queries, head counts, head sizes and lengths that are not powers of two (masks at the
tails of every block), |z| up to 5,000, bf16 and fp32, both layouts attention takes, YaRN's factor, gradients asked
for only in part; `RepoLayer` running them (`rope.set_kernels`), with the index blend and under autocast; and the
check before a variant first runs (`olmo_repo.kernels.select`): it runs the variant the real call compiles, catches a
kernel made wrong by the size of the one miscompile seen on a GPU, and the layer then runs the torch path.

Two ways to run it, each in a process of its own (the mode is fixed when `@triton.jit` runs, at import):

- on CPU under Triton's interpreter (TRITON_INTERPRET=1; tests/test_kernels.py does, in `make test`): numpy
  computes, fp32 inside as on the device, so this checks indexing, masks and gradients, not the device's rounding;
- on a GPU without it (bench/gpu_check.sh does first): the same checks, and the 1B's shapes.

    TRITON_INTERPRET=1 .venv/bin/python -m pytest --noconftest tests/kernel_checks.py    # CPU
    python3 -m pytest --noconftest tests/kernel_checks.py                                # a CUDA machine
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F
import triton
from torch import nn

import olmo_repo.kernels
from olmo_repo.kernels import f_phi as tail_module
from olmo_repo.kernels import f_phi_tail, rotate_qk, select
from olmo_repo.kernels import rotation as rotation_module
from olmo_repo.rope import RepoLayer, set_kernels
from olmo_repo.rotation import inv_frequencies, rotate_reference

from .bounds import assert_within, rotation_magnitude, rotation_roundings

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 (Triton's interpreter on CPU)", allow_module_level=True)
EPS32 = torch.finfo(torch.float32).eps


def randn(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """Normal samples drawn on CPU (the same on either device), on DEVICE."""
    return torch.randn(shape, generator=gen).to(DEVICE)


def _in(dtype: torch.dtype, fp32_roundings: float, roundings: float = 1.0) -> float:
    """A rounding count in units of `dtype`'s eps: `roundings` of its own (rounding the fp32 result into it)
    plus `fp32_roundings` of the fp32 arithmetic inside."""
    return roundings + fp32_roundings * EPS32 / torch.finfo(dtype).eps


def _oracle(q, k, z, inv_freq, scale, tokens_first, gq, gk):
    """The rotation in float64 with the positions expanded to every query head by hand, and its gradients."""
    qd, kd, zd = (t.detach().double().requires_grad_() for t in (q, k, z))
    heads = -2 if tokens_first else -3
    group = q.shape[heads] // k.shape[heads]
    zq, zk = zd.repeat_interleave(group, dim=-2), zd  # [..., H, T], [..., H_kv, T]
    if tokens_first:  # the plain formula wants [..., H, T, d]
        rq = rotate_reference(qd.transpose(-2, -3), zq, inv_freq.double()).transpose(-2, -3) * scale
        rk = rotate_reference(kd.transpose(-2, -3), zk, inv_freq.double()).transpose(-2, -3) * scale
    else:
        rq = rotate_reference(qd, zq, inv_freq.double()) * scale
        rk = rotate_reference(kd, zk, inv_freq.double()) * scale
    loss = (rq * gq.double()).sum() + (0 if gk is None else (rk * gk.double()).sum())
    return rq, rk, dict(zip(("q", "k", "z"), torch.autograd.grad(loss, (qd, kd, zd), allow_unused=True)))


ROTATIONS = {
    # name: (dtype, q shape, H_kv, tokens_first, head size, scale, what needs a gradient)
    "fp32 grouped, H 6 / H_kv 3, T 37 over two blocks, d 80": (
        torch.float32, (2, 6, 37), 3, False, 80, 1.0, "qkz"),
    "bf16 tokens first, multi-query, YaRN factor, d 16": (torch.bfloat16, (1, 9, 4), 1, True, 16, 1.25, "qkz"),
    "bf16 packed tokens [T, H, d] (vLLM), d 112, no autograd": (torch.bfloat16, (5, 4), 4, True, 112, 1.0, ""),
    "fp32 HF layout (a transposed view), positions shared by the batch, only q used, d 96": (
        torch.float32, (2, 4, 7), 2, False, 96, 1.0, "qz"),
}  # fmt: skip
if not INTERPRETED:  # the 1B's micro-batch on the device: many token blocks, grouped and not
    ROTATIONS["bf16 1B, 4 x 4096, H 16 / H_kv 4, d 128"] = (
        torch.bfloat16,
        (4, 16, 4096),
        4,
        False,
        128,
        1.0,
        "qkz",
    )
    ROTATIONS["bf16 1B tokens first (OLMo-core), H_kv 16"] = (
        torch.bfloat16,
        (4, 4096, 16),
        16,
        True,
        128,
        1.0,
        "qkz",
    )


@pytest.mark.parametrize("case", ROTATIONS)
def test_rotation_against_float64(case):
    dtype, shape, n_kv, tokens_first, d, scale, needs = ROTATIONS[case]
    gen = torch.Generator().manual_seed(0)
    lead, (H, T) = shape[:-2], ((shape[-1], shape[-2]) if tokens_first else shape[-2:])
    heads_at = -2 if tokens_first else -3
    q_shape = (*lead, T, H, d) if tokens_first else (*lead, H, T, d)
    k_shape = list(q_shape)
    k_shape[heads_at] = n_kv
    q, k = randn(*q_shape, gen=gen).to(dtype), randn(*k_shape, gen=gen).to(dtype)
    if "view" in case:  # HF's q and k: [B, T, H, d] projections seen as [B, H, T, d]
        q, k = (
            q.transpose(-2, -3).contiguous().transpose(-2, -3),
            k.transpose(-2, -3).contiguous().transpose(-2, -3),
        )
        assert not q.is_contiguous()
    z_lead = (1, *lead[1:]) if "shared" in case else lead
    z = randn(*z_lead, n_kv, T, gen=gen) * 2000
    z.view(-1)[0], z.view(-1)[-1] = 5000.0, -5000.0
    q.requires_grad_("q" in needs), k.requires_grad_("k" in needs), z.requires_grad_("z" in needs)
    inv_freq = inv_frequencies(d, 10_000.0, torch.device(DEVICE))
    oq, ok = rotate_qk(q, k, z, inv_freq, scale, tokens_first=tokens_first)
    assert oq.shape == q.shape and ok.shape == k.shape and oq.dtype == ok.dtype == dtype
    gq, gk = randn(*q.shape, gen=gen).to(dtype), randn(*k.shape, gen=gen).to(dtype)
    gk = None if "only q" in case else gk
    rq, rk, truth = _oracle(q, k, z, inv_freq, scale, tokens_first, gq, gk)
    angle = rotation_roundings(z, inv_freq)  # fp32 roundings of a rotated element (the angle's dominate)
    assert_within(oq, rq, roundings=_in(dtype, angle), magnitude=scale * rotation_magnitude(q), what="q")
    assert_within(ok, rk, roundings=_in(dtype, angle), magnitude=scale * rotation_magnitude(k), what="k")
    if not needs:
        assert not oq.requires_grad
        return
    loss = (oq * gq).sum() + (0 if gk is None else (ok * gk).sum())
    inputs = [t for t in (q, k, z) if t.requires_grad]
    grads = dict(zip((n for n in "qkz" if n in needs), torch.autograd.grad(loss, inputs, allow_unused=True)))
    for name, g in (("q", gq), ("k", gk)):
        if name in needs and g is not None:
            assert grads[name].dtype == dtype
            magnitude = scale * rotation_magnitude(g)
            assert_within(
                grads[name], truth[name], roundings=_in(dtype, angle), magnitude=magnitude, what=f"d{name}"
            )
    # dL/dz: per position, sum over the group's query heads and the key of d/2 products g * out, each of the
    # rotation's error (and out's rounding into dtype), summed in fp32.
    terms = torch.zeros(z.shape, dtype=torch.float64, device=DEVICE)
    for x, g in ((q, gq), (k, gk)):
        if g is not None:
            pairs = rotation_magnitude(g).chunk(2, -1)[0] * scale * rotation_magnitude(x).chunk(2, -1)[0]
            per_head = (pairs * inv_freq.double()).sum(-1)  # [..., H, T] or [..., T, H]
            per_head = per_head.transpose(-1, -2) if tokens_first else per_head
            terms = terms + per_head.unflatten(-2, (n_kv, -1)).sum(-2).sum_to_size(z.shape)
    count = (H // n_kv + 1) * d
    assert_within(grads["z"], truth["z"], roundings=_in(dtype, angle + count, 2), eps=torch.finfo(dtype).eps,
                  magnitude=terms, what="dz")  # fmt: skip


def _tail_oracle(gate_content: torch.Tensor, final_map: torch.Tensor):
    gd, wd = gate_content.detach().double().requires_grad_(), final_map.detach().double().requires_grad_()
    gate, content = gd.chunk(2, -1)
    return gd, wd, gate, content, F.linear(F.silu(gate) * content, wd)


@pytest.mark.parametrize(
    "rows, hidden, n_out, w_dtype, programs",
    [
        ((2, 19), 200, 5, torch.float32, 2),  # hidden in 4 blocks with a tail; 3 row blocks on 2 programs
        ((3,), 24, 1, torch.bfloat16, 512),  # one key/value head (multi-query), final_map in bf16, no grad
    ],
)
def test_f_phi_tail_against_float64(monkeypatch, rows, hidden, n_out, w_dtype, programs):
    monkeypatch.setattr(tail_module, "PROGRAMS", programs)
    gen = torch.Generator().manual_seed(1)
    gate_content = (randn(*rows, 2 * hidden, gen=gen) * 3).requires_grad_()
    final_map = randn(n_out, hidden, gen=gen).to(w_dtype).requires_grad_(w_dtype == torch.float32)
    N = gate_content[..., 0].numel()
    z = f_phi_tail(gate_content, final_map)
    assert z.dtype == torch.float32 and z.shape == (*gate_content.shape[:-1], n_out)
    gd, wd, gate, content, truth = _tail_oracle(gate_content, final_map)
    h = (F.silu(gate) * content).detach()
    # Each h_j is within a few roundings (SiLU's exp, division, product) of |h_j|; then hidden-long sums.
    assert_within(z, truth, roundings=hidden + 8, magnitude=h.abs() @ wd.detach().abs().T, what="z")
    dz = randn(*z.shape, gen=gen)
    got = torch.autograd.grad((z * dz).sum(), [t for t in (gate_content, final_map) if t.requires_grad])
    want = torch.autograd.grad((truth * dz.double()).sum(), (gd, wd))
    dh = dz.double().abs() @ wd.detach().abs()  # [..., hidden]: magnitude of dL/dh
    # SiLU's derivative sig (1 + g (1 - sig)) is at most 1.1, its roundings at most |g| eps in absolute terms.
    g = gate.detach()
    magnitude = torch.cat((dh * content.detach().abs() * (1 + g.abs()), dh * F.silu(g).abs()), -1)
    assert_within(got[0], want[0], roundings=n_out + 10, magnitude=magnitude, what="d(gate, content)")
    if final_map.requires_grad:
        magnitude = dz.double().abs().flatten(0, -2).T @ h.abs().flatten(0, -2)  # [n_out, hidden]
        assert_within(got[1], want[1], roundings=N + 8, magnitude=magnitude, what="d final_map")


# --------------------------------------------------------------------------- RepoLayer runs them (rope.py)

D, HD, THETA = 64, 16, 10_000.0


class Layer(RepoLayer, nn.Module):
    def __init__(self, n_kv: int, scale: float = 1.0):
        super().__init__()
        self.init_repo("repo", layer_id=0, d_model=D, n_kv_heads=n_kv, head_dim=HD, rope_theta=THETA)
        self.scale = scale
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for w in self.f_phi_weights():
                w.copy_(torch.randn(w.shape, generator=gen))  # positions in the tens
        self.to(DEVICE)

    def rope_frequencies(self, device):
        return inv_frequencies(HD, THETA, device), self.scale


def test_traced_by_torch_compile_the_layer_runs_the_torch_code_in_one_graph():
    """torch.compile's tracing (vLLM compiles its model whole, fullgraph) asks for no kernel and breaks no graph:
    the torch code runs there, which inductor fuses."""
    layer = Layer(2)
    gen = torch.Generator().manual_seed(7)
    x, q, k = randn(1, 5, D, gen=gen), randn(1, 4, 5, HD, gen=gen), randn(1, 2, 5, HD, gen=gen)
    set_kernels(layer, "kernels")
    with torch.no_grad():
        traced = torch.compile(layer.reposition, fullgraph=True, backend="eager")(x, q, k)
        set_kernels(layer, "torch")
        want = layer.reposition(x, q, k)
    assert all(torch.equal(t, w) for t, w in zip(traced, want))


def test_the_layer_runs_the_kernels_where_set_kernels_says():
    gen = torch.Generator().manual_seed(3)
    q, k, z = randn(1, 4, 3, HD, gen=gen), randn(1, 2, 3, HD, gen=gen), randn(1, 2, 3, gen=gen)
    # By default on CUDA tensors only; CPU tensors take the torch code.
    assert select.runs(None, q, k, z) is not INTERPRETED
    assert select.runs("kernels", q, k, z)
    assert not select.runs("kernels", q.double(), k.double(), z.double())  # float64: the reference
    assert not select.runs("torch", q, k, z)
    layer = Layer(2)
    with pytest.raises(ValueError, match="kernels='cuda': one of None, 'torch', 'kernels'"):
        set_kernels(layer, "cuda")
    set_kernels(layer, "kernels")
    assert layer.repo_kernels == "kernels"


@pytest.mark.parametrize("n_kv, tokens_first, scale", [(2, False, 1.0), (1, True, 1.25)])
def test_layer_positions_and_rotation_through_the_kernels_against_float64(n_kv, tokens_first, scale):
    """`predict_positions` (joined GEMM, the tail kernel) and `apply_positions` (the rotation kernel) with
    gradients into x, f_phi's weights, q and k, against the layer in float64 on the torch code."""
    B, T, H = 2, 11, 4
    layer = Layer(n_kv, scale)
    set_kernels(layer, "kernels")
    truth_layer = Layer(n_kv, scale).double()
    gen = torch.Generator().manual_seed(4)
    x = randn(B, T, D, gen=gen).requires_grad_()
    q = randn(*((B, T, H, HD) if tokens_first else (B, H, T, HD)), gen=gen).requires_grad_()
    k = randn(*((B, T, n_kv, HD) if tokens_first else (B, n_kv, T, HD)), gen=gen).requires_grad_()
    z = layer.predict_positions(x)  # [B, H_kv, T]
    rq, rk = layer.apply_positions(q, k, z, tokens_first=tokens_first)
    gq, gk = randn(*rq.shape, gen=gen), randn(*rk.shape, gen=gen)
    params = [x, q, k, *layer.f_phi_weights()]
    grads = torch.autograd.grad((rq * gq).sum() + (rk * gk).sum(), params)
    xd, qd, kd = (t.detach().double().requires_grad_() for t in (x, q, k))
    zd = truth_layer.predict_positions(xd)
    tq, tk = truth_layer.apply_positions(qd, kd, zd, tokens_first=tokens_first)
    truth = torch.autograd.grad((tq * gq.double()).sum() + (tk * gk.double()).sum(),
                                [xd, qd, kd, *truth_layer.f_phi_weights()])  # fmt: skip
    # Positions: f_phi's reduction lengths (d_model, hidden, the key/value heads) and a few roundings more. The
    # rotated q and k: the fp32 angle at |z| plus the positions' error (x the largest frequency, 1). Gradients:
    # twice that and the query group's sum backward, plus the tokens a weight's gradient sums over.
    pos = D + D // 8 + n_kv + 16
    angle = rotation_roundings(zd, inv_frequencies(HD, THETA, z.device)) + pos * zd.abs().max().item()
    assert_within(z, zd, roundings=pos, what="positions")
    for got, want, x_in, what in ((rq, tq, q, "q"), (rk, tk, k, "k")):
        assert_within(got, want, roundings=angle, magnitude=scale * rotation_magnitude(x_in), what=what)
    names = ("dx", "dq", "dk", "d gate_map", "d content_map", "d final_map")
    for got, want, what in zip(grads, truth, names):
        assert_within(got, want, roundings=2 * (angle + pos + H // n_kv * HD) + B * T, what=what)


def test_layer_under_bf16_autocast_with_the_index_blend_through_the_kernels():
    """Mixed precision as the trainers run it (autocast bf16, f_phi recomputed in backward), rotating by the
    index blend (1 - p) z + p i (issue 48's positions arrive final): the kernels' forward against float64 on
    the bf16 inputs, and the same gradients' finiteness and shapes."""
    B, T, H, n_kv = 1, 13, 4, 2
    layer = Layer(n_kv)
    layer.index_blend = 0.5
    set_kernels(layer, "kernels")
    gen = torch.Generator().manual_seed(5)
    x = randn(B, T, D, gen=gen).requires_grad_()
    q = randn(B, H, T, HD, gen=gen).bfloat16().requires_grad_()
    k = randn(B, n_kv, T, HD, gen=gen).bfloat16().requires_grad_()
    index = torch.arange(100, 100 + T, device=DEVICE)  # after a KV cache's 100 tokens
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        rq, rk = layer.reposition(x, q, k, index=index)
        z = layer.rotation_positions(x, index)
    assert rq.dtype == rk.dtype == torch.bfloat16 and z.dtype == torch.float32
    truth_layer = Layer(n_kv).double()
    truth_layer.index_blend = 0.5
    with torch.no_grad():
        for w, w64, low in zip(layer.f_phi_weights(), truth_layer.f_phi_weights(), (True, True, False)):
            w64.copy_(w.bfloat16() if low else w)  # what the bf16 GEMM multiplies; final_map's runs in fp32
        zd = truth_layer.rotation_positions(x.detach().bfloat16().double(), index)
        tq, tk = truth_layer.apply_positions(q.double(), k.double(), zd)
    pos = D + D // 8 + n_kv + 16
    assert_within(z, zd, roundings=pos, eps=EPS32, what="blended positions")
    # bf16 out: one rounding, plus the fp32 angle at |z| and the positions' own error (x the largest frequency, 1).
    angle = rotation_roundings(zd, inv_frequencies(HD, THETA, z.device)) + pos * zd.abs().max().item()
    for got, want, x_in, what in ((rq, tq, q, "q"), (rk, tk, k, "k")):
        assert_within(
            got, want, roundings=_in(torch.bfloat16, angle), magnitude=rotation_magnitude(x_in), what=what
        )
    grads = torch.autograd.grad(rq.float().sum() + rk.float().sum(), (x, q, k, *layer.f_phi_weights()))
    assert all(g is not None and g.shape == t.shape and g.isfinite().all() for g, t in
               zip(grads, (x, q, k, *layer.f_phi_weights())))  # fmt: skip


# ------------------------------------------------ the check before a variant first runs (kernels/select.py)

MISCOMPILE = 1.2e-3
"""The smallest error of the one miscompile seen on a GPU: f_phi's tail backward off by 1.2e-3 of a row's largest
gradient (an H100, Triton 3.6; bench/RESULTS.md)."""


def _miscompiled(real):
    """`real` (a kernel's host function) with its first result moved by MISCOMPILE of each row's largest |element|."""

    def wrong(*args, **kwargs):
        first, *rest = real(*args, **kwargs)
        return (first + MISCOMPILE * first.abs().amax(-1, keepdim=True), *rest)

    return wrong


FAULTS = {  # what is made wrong: (module, host function, what the warning names)
    "f_phi's tail backward": (tail_module, "_tail_backward", "f_phi tail", "dL/d(gate, content) is off by"),
    "the rotation's backward (dL/dz)": (rotation_module, "_backward", "rotation", "dL/dz is off by"),
}


def _run_layer(case: str, layer: Layer, x, q, k, z) -> list[torch.Tensor]:
    """The outputs of f_phi (`predict_positions`) or of the rotation (`apply_positions`) and their gradients for a
    loss whose gradient differs per element."""
    if case.startswith("f_phi"):
        outs, wrt = [layer.predict_positions(x)], [x, *layer.f_phi_weights()]
    else:
        outs, wrt = list(layer.apply_positions(q, k, z)), [q, k, z]
    loss = sum((o * torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o)).sum() for o in outs)
    return [*outs, *torch.autograd.grad(loss, wrt)]


@pytest.mark.parametrize("case", FAULTS)
def test_a_kernel_wrong_by_the_miscompile_is_caught_once_and_the_layer_runs_the_torch_path(monkeypatch, case):
    module, name, kernel, what = FAULTS[case]
    monkeypatch.setattr(module, name, _miscompiled(getattr(module, name)))
    select.forget()
    layer, torch_layer = Layer(2), Layer(2)  # the same weights
    set_kernels(layer, "kernels")
    set_kernels(torch_layer, "torch")
    gen = torch.Generator().manual_seed(8)
    x, q, k = randn(2, 19, D, gen=gen), randn(2, 4, 19, HD, gen=gen), randn(2, 2, 19, HD, gen=gen)
    z = randn(2, 2, 19, gen=gen) * 100
    inputs = [t.requires_grad_() for t in (x, q, k, z)]
    with pytest.warns(RuntimeWarning) as caught:
        runs = [_run_layer(case, layer, *inputs) for _ in range(2)]
    select.forget()
    assert len(caught) == 1, [str(w.message) for w in caught]  # one warning, the specialisation decided once
    message = str(caught[0].message)
    for part in (
        f"RePo's {kernel} (",
        what,
        f"Triton {triton.__version__}",
        f"torch {torch.__version__}",
        "cpu",
    ):
        assert part in message, message
    want = _run_layer(case, torch_layer, *inputs)
    for got in runs:
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("n_kv", [16, 4])
def test_at_the_1bs_f_phi_the_check_passes_the_kernel_and_fails_the_miscompile_tenfold(monkeypatch, n_kv):
    """f_phi of the 1B (hidden 256) at 4 x 4096 tokens, bf16 final_map, MHA and GQA: the check's worst error is
    within its fp32 bound for the kernel, and ten times over it for the kernel wrong by the miscompile's size."""
    final_map = torch.zeros(n_kv, 256, dtype=torch.bfloat16, device=DEVICE)
    worst = lambda: max(a.ratio for a in tail_module._check(4 * 4096, final_map, True))  # noqa: E731
    assert worst() <= 1
    monkeypatch.setattr(tail_module, "_tail_backward", _miscompiled(tail_module._tail_backward))
    assert worst() >= 10


def _spy(monkeypatch, module, names: list[str]) -> dict[str, list]:
    """Record Triton's own specialisation of every launch of module's kernels `names` (its key for a compiled
    variant: each argument's type, an integer's equality to 1 and divisibility by 16, a pointer's 16-byte
    alignment; and the constexprs), then launch them."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    seen: dict[str, list] = {name: [] for name in names}

    class Spy:
        def __init__(self, name: str):
            self.name, self.kernel = name, getattr(module, name)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                spec = tuple(native_specialize_impl(BaseBackend, a, False, True, True)[:2] for a in args)
                seen[self.name].append((spec, sorted(kwargs.items())))
                return self.kernel[grid](*args, **kwargs)

            return launch

    for name in names:
        monkeypatch.setattr(module, name, Spy(name))
    return seen


def _unaligned(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """Normal samples whose data starts 4 bytes past a 16-byte boundary."""
    n = torch.Size(shape).numel()
    return torch.randn(n + 1, generator=gen)[1:].to(DEVICE).view(shape)


SPECIALISATIONS = {  # q, k, positions, tokens_first: the real call's inputs
    "HF's [B, H, T, d] view of [B, T, H, d], grouped, T 300, positions [B, T, H_kv] transposed": lambda g: (
        randn(2, 300, 4, 16, gen=g).transpose(1, 2), randn(2, 300, 2, 16, gen=g).transpose(1, 2),
        randn(2, 300, 2, gen=g).transpose(1, 2), False),
    "tokens first, one token (a decode step), k not 16-byte aligned": lambda g: (
        randn(1, 1, 4, 16, gen=g), _unaligned(1, 1, 2, 16, gen=g), randn(1, 2, 1, gen=g), True),
    "bf16, multi-query, positions shared by 3 batch rows, T 48": lambda g: (
        randn(3, 2, 48, 16, gen=g).bfloat16(), randn(3, 1, 48, 16, gen=g).bfloat16(), randn(1, 1, 48, gen=g), False),
}  # fmt: skip


@pytest.mark.parametrize("case", SPECIALISATIONS)
def test_the_rotations_check_compiles_the_variants_the_real_call_runs(monkeypatch, case):
    """Triton compiles once per specialisation: the check launches the forward and backward variants (the same
    arguments' types, classes and constexprs) that the real call then launches, so it checks them and adds no
    compile of its own."""
    seen = _spy(monkeypatch, rotation_module, ["rotate_fwd", "rotate_bwd"])
    q, k, z, tokens_first = SPECIALISATIONS[case](torch.Generator().manual_seed(9))
    grad = "decode" not in case
    for t in (q, k, z):
        t.requires_grad_(grad)
    select.forget()
    assert rotation_module.ready(q, k, z, tokens_first, grad)
    checked = {name: launches[:] for name, launches in seen.items()}
    for launches in seen.values():
        launches.clear()
    oq, ok = rotate_qk(q, k, z, inv_frequencies(16, THETA, torch.device(DEVICE)), tokens_first=tokens_first)
    if grad:
        (oq.float().sum() + ok.float().sum()).backward()
    assert [len(v) for v in checked.values()] == [1, int(grad)] and seen == checked


def test_f_phis_check_compiles_the_variants_the_real_call_runs(monkeypatch):
    seen = _spy(monkeypatch, tail_module, ["tail_fwd", "tail_bwd"])
    gen = torch.Generator().manual_seed(10)
    gate_content, final_map = randn(2, 37, 2 * 24, gen=gen).requires_grad_(), randn(3, 24, gen=gen).bfloat16()
    select.forget()
    assert olmo_repo.kernels.f_phi_ready(2 * 37, final_map, True)
    checked = {name: launches[:] for name, launches in seen.items()}
    for launches in seen.values():
        launches.clear()
    z = f_phi_tail(gate_content, final_map).transpose(-1, -2)  # [B, H_kv, T], as f_phi returns it
    (z * randn(*z.shape, gen=gen)).sum().backward()
    assert [len(v) for v in checked.values()] == [1, 1] and seen == checked


def test_olmo_repo_kernels_sets_the_policy(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    try:
        for value, on_cuda in (("0", False), ("check", True), ("1", True)):
            monkeypatch.setenv(select.ENV, value)
            select.mode.cache_clear()
            assert select.wanted(None, cuda) is on_cuda and not select.wanted(None, cpu)
            assert select.wanted("kernels", cpu) and not select.wanted("torch", cuda)

        def unchecked():
            raise AssertionError("OLMO_REPO_KERNELS=1 runs no check")

        assert select.verdict((cpu, "unchecked"), unchecked, str)
        monkeypatch.setenv(select.ENV, "yes")
        select.mode.cache_clear()
        with pytest.raises(
            ValueError, match=r"OLMO_REPO_KERNELS='yes' is not one of the allowed values \(0: "
        ):
            select.mode()
    finally:
        monkeypatch.delenv(select.ENV)
        select.mode.cache_clear()


def test_a_verdict_is_reached_once_however_many_threads_ask():
    select.forget()
    calls = []

    def check() -> list[select.Agreement]:
        calls.append(threading.get_ident())
        time.sleep(0.2)  # the other threads arrive meanwhile
        return [select.Agreement("z", 0.0, 1.0)]

    with ThreadPoolExecutor(8) as pool:
        verdicts = list(
            pool.map(lambda _: select.verdict((torch.device("cpu"), "threads"), check, str), range(8))
        )
    select.forget()
    assert verdicts == [True] * 8 and len(calls) == 1


if not INTERPRETED:  # the device's own arithmetic: on a GPU only

    def test_on_the_device_the_kernels_agree_with_the_torch_code_and_compile_traces_the_torch_code():
        """fp32 on the GPU: the rotation kernel (FP fusion off, libdevice's sin/cos) against the torch code's
        eager forward (the same ops, each rounded: bit for bit where the device's sin/cos are the same
        functions); and a torch.compile'd layer (vLLM's compiled model) traces the torch code, which inductor
        fuses."""
        layer = Layer(4)
        gen = torch.Generator().manual_seed(6)
        q, k = randn(2, 16, 512, HD, gen=gen), randn(2, 4, 512, HD, gen=gen)
        z = randn(2, 4, 512, gen=gen) * 2000
        with torch.no_grad():
            got = layer.apply_positions(q, k, z)
            set_kernels(layer, "torch")
            want = layer.apply_positions(q, k, z)
            traced = torch.compile(lambda *a: layer.apply_positions(*a))(q, k, z)
        same = sum((g == w).sum().item() for g, w in zip(got, want)) / sum(g.numel() for g in got)
        print(f"rotation kernel against the eager torch code, fp32: {same:.4%} of the elements bit for bit")
        roundings = 2 * rotation_roundings(z, inv_frequencies(HD, THETA, z.device))
        for g, w, t, x_in in zip(got, want, traced, (q, k)):
            assert_within(
                g, w.double(), roundings=roundings, magnitude=rotation_magnitude(x_in), what="kernel"
            )
            assert_within(
                t, w.double(), roundings=roundings, magnitude=rotation_magnitude(x_in), what="compiled"
            )
