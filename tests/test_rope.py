"""RoPE from real per-head positions: OLMo parity, the efficient autograd path, precision."""

from __future__ import annotations

import pytest
import torch
from olmo.model import BufferCache, RotaryEmbedding

from olmo_repo.rotation import inv_frequencies, rotate, rotate_forward, rotate_qk, rotate_reference

from .conftest import tiny_config
from .numerics import assert_within, rotation_magnitude, rotation_roundings


def test_integer_positions_reproduce_olmo_rope():
    config = tiny_config(d_model=128, n_heads=4)
    B, H, T, D = 2, 4, 48, 32
    q, k = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    q_olmo, k_olmo = RotaryEmbedding(config, BufferCache())(q, k)
    positions = torch.arange(T, dtype=torch.float32).expand(B, H, T)
    inv_freq = inv_frequencies(D, config.rope_theta)
    roundings = rotation_roundings(positions, inv_freq)
    for x, olmo in ((q, q_olmo), (k, k_olmo)):
        truth = rotate_reference(x.double(), positions.double(), inv_freq.double())
        assert_within(
            rotate(x, positions, inv_freq), truth, roundings=roundings, magnitude=rotation_magnitude(x)
        )
        assert_within(olmo, truth, roundings=roundings, magnitude=rotation_magnitude(x), what="OLMo's RoPE")


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])  # inductor
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_efficient_path_equals_plain_formula_with_gradients(dtype, compiled):
    B, H, T, D = 2, 3, 17, 16
    x = torch.randn(B, H, T, D, dtype=dtype, requires_grad=True)
    z = (torch.randn(B, H, T, dtype=dtype) * 50).requires_grad_()
    inv_freq = inv_frequencies(D, 10_000.0)
    g = torch.randn(B, H, T, D, dtype=dtype)
    out_fast = rotate(x, z, inv_freq, compiled=compiled)
    gx_fast, gz_fast = torch.autograd.grad(out_fast, (x, z), g)
    # Ground truth: the plain formula in float64 on the same inputs.
    xd, zd = x.detach().double().requires_grad_(), z.detach().double().requires_grad_()
    out_ref = rotate_reference(xd, zd, inv_freq.double())
    gx_ref, gz_ref = torch.autograd.grad(out_ref, (xd, zd), g.double())
    roundings = rotation_roundings(z, inv_freq)
    assert_within(out_fast, out_ref, roundings=roundings, magnitude=rotation_magnitude(x), what="rotation")
    assert_within(gx_fast, gx_ref, roundings=roundings, magnitude=rotation_magnitude(g), what="dL/dx")
    # dL/dz = sum_k f_k (g2_k out1_k - g1_k out2_k): d/2 products and sums on top of out's error.
    magnitude = (
        inv_freq.double() * rotation_magnitude(g).chunk(2, -1)[0] * rotation_magnitude(x).chunk(2, -1)[0]
    )
    assert_within(gz_fast, gz_ref, roundings=roundings + D, magnitude=magnitude.sum(-1), what="dL/dz")


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])  # inductor
def test_gradcheck_float64(compiled):
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    z = (torch.randn(1, 2, 5, dtype=torch.float64) * 3).requires_grad_()
    inv_freq = inv_frequencies(8, 100.0).double()
    assert torch.autograd.gradcheck(lambda a, b: rotate(a, b, inv_freq, compiled=compiled), (x, z))


@pytest.mark.parametrize("use", ["both", "q only", "k only"])
def test_rotate_qk_equals_two_rotations_with_gradients(use):
    q = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    z = (torch.randn(2, 3, 9, dtype=torch.float64) * 10).requires_grad_()
    inv_freq = inv_frequencies(8, 1000.0).double()

    def loss(qr, kr):
        terms = {
            "both": (qr * kr).sum() + qr.pow(2).sum(),
            "q only": qr.pow(3).sum(),
            "k only": kr.sin().sum(),
        }
        return terms[use]

    fast = torch.autograd.grad(loss(*rotate_qk(q, k, z, inv_freq)), (q, k, z), allow_unused=True)
    plain = torch.autograd.grad(
        loss(rotate_reference(q, z, inv_freq), rotate_reference(k, z, inv_freq)), (q, k, z), allow_unused=True
    )
    for a, b in zip(fast, plain):
        if b is None:
            assert a is None or a.abs().max() == 0
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b, c: rotate_qk(a, b, c, inv_freq), (q, k, z))


def test_rotation_preserves_norm_and_relative_positions():
    B, H, T, D = 1, 2, 6, 16
    q, k = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    z = torch.randn(B, H, T) * 20
    inv_freq = inv_frequencies(D, 500_000.0)
    qd, kd, zd, fd = q.double(), k.double(), z.double(), inv_freq.double()
    truth = rotate_reference(qd, zd, fd) @ rotate_reference(kd, zd, fd).transpose(-1, -2)  # [B, H, T, T]
    shifted = rotate(q, z + 123.25, inv_freq) @ rotate(k, z + 123.25, inv_freq).transpose(-1, -2)
    # Each rotated vector is off by `roundings` (angles up to |z| + 123.25), then D products are summed.
    roundings = 2 * rotation_roundings(z + 123.25, inv_freq) + D
    magnitude = rotation_magnitude(q) @ rotation_magnitude(k).transpose(-1, -2)
    assert_within(shifted, truth, roundings=roundings, magnitude=magnitude, what="shifted scores")
    norm = rotate(q, z, inv_freq).norm(dim=-1)
    assert_within(
        norm, qd.norm(dim=-1), roundings=rotation_roundings(z, inv_freq) + D, magnitude=2 * qd.norm(dim=-1)
    )


def test_angles_stay_fp32_for_bf16_inputs_under_autocast():
    """A position like 4095.3 must not be quantised: angles are fp32 even for bf16 q/k under autocast."""
    D = 64
    x = torch.randn(1, 1, 1, D)
    z = torch.tensor([[[4095.3]]])
    inv_freq = inv_frequencies(D, 500_000.0)
    exact = rotate_reference(x.double(), z.double(), inv_freq.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = rotate(x.bfloat16(), z, inv_freq)
    assert out.dtype == torch.bfloat16
    # x rounded to bf16 on the way in and the result on the way out (half an ulp each), and the fp32 angle
    # (4095 eps32, 0.06 bf16 ulp): 2 bf16 roundings. Quantised positions (step 16) would be off by O(1).
    assert_within(out, exact, roundings=2, magnitude=rotation_magnitude(x), what="bf16 rotation")
    off = rotate_reference(x.bfloat16().double(), z.double() + 16, inv_freq.double())
    with pytest.raises(AssertionError, match="exceeds the bound"):
        assert_within(off.bfloat16(), exact, roundings=2, magnitude=rotation_magnitude(x))


@pytest.mark.parametrize("compiled", [False, True])
def test_rotated_q_and_k_keep_their_layout_in_memory(compiled):
    """OLMo's and HF's q and k are [B, H, T, d] views of [B, T, H, d] projections; attention's output follows q's
    layout, so a rotation that returned them contiguous made the output projection copy attention's output (kept
    for backward: 4,096 bytes per token per layer at the 1B)."""
    q = torch.randn(2, 5, 4, 16, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()  # [B, H, T, d]
    z, inv_freq = torch.randn(2, 4, 5) * 10, inv_frequencies(16, 1e4)
    (out,) = rotate_forward(z, inv_freq, [q])
    assert out.stride() == q.stride() and torch.equal(out, rotate_forward(z, inv_freq, [q.contiguous()])[0])
    assert all(o.stride() == q.stride() for o in rotate_qk(q, q, z, inv_freq, compiled=compiled))
