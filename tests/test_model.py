"""The RePo/NoPE blocks inside a real OLMo model: equivalences, gradients, KV cache, factory."""

from __future__ import annotations

import pytest
import torch
from olmo.config import ActivationCheckpointingStrategy, ModelConfig
from olmo.model import OLMo, OLMoBlock, OLMoSequentialBlock, RotaryEmbedding

import olmo_repo
from olmo_repo import (
    PositionMode,
    RepoSequentialBlock,
    build_model,
    layer_modes,
    predict_positions,
    repo_blocks,
    repo_layer_ids,
)
from olmo_repo.modes import PositionSource
from olmo_repo.rope import f_phi, set_index_blend
from olmo_repo.rotation import COMPILED_ROTATION, inv_frequencies, rotate, rotate_qk, rotate_reference
from olmo_repo.upstream.olmo import STOCK_BLOCK_BUILD

from .conftest import spread_positions, tiny_config
from .numerics import assert_within, float64_truth, model_roundings, rotation_magnitude, rotation_roundings

B, T = 2, 24


def _ids(T: int = T) -> torch.Tensor:
    return torch.randint(0, 100, (B, T))


def _copy_base(dst: OLMo, src: OLMo) -> None:
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert not unexpected and all(
        k.rsplit(".", 2)[-2] in {"gate_map", "content_map", "final_map"} for k in missing
    )


def test_stock_config_builds_the_stock_model_bit_for_bit(monkeypatch):
    stock_config = ModelConfig(**{k: v for k, v in tiny_config().asdict().items() if not k.startswith("pe_")})
    ids = _ids()
    torch.manual_seed(1)
    ours = build_model(stock_config)
    with monkeypatch.context() as m:
        m.setattr(OLMoBlock, "build", classmethod(STOCK_BLOCK_BUILD))
        torch.manual_seed(1)
        stock = OLMo(stock_config)
    assert all(type(b) is OLMoSequentialBlock for b in ours.transformer.blocks)
    assert ours.state_dict().keys() == stock.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), stock.state_dict().values()))
    assert torch.equal(ours(ids).logits, stock(ids).logits)
    # A RepoModelConfig in rope mode is the stock model too.
    torch.manual_seed(1)
    rope = build_model(tiny_config())
    assert torch.equal(rope(ids).logits, stock(ids).logits)


def test_install_is_idempotent():
    before = OLMoBlock.__dict__["build"]
    olmo_repo.install()
    olmo_repo.install()
    assert OLMoBlock.__dict__["build"].__func__ is before.__func__


def test_repo_with_integer_positions_equals_rope(monkeypatch):
    rope = build_model(tiny_config())
    repo = build_model(tiny_config(pe_mode="repo", pe_start_layer=1))
    _copy_base(repo, rope)
    monkeypatch.setattr(
        RepoSequentialBlock,
        "predict_positions",
        lambda self, x: torch.arange(x.shape[1], dtype=torch.float32).expand(
            x.shape[0], self.config.n_heads, -1
        ),
    )
    ids = _ids()
    # Two fp32 computations of the same logits (OLMo's RoPE tables vs angles from the positions).
    assert_within(repo(ids).logits, rope(ids).logits, roundings=2 * model_roundings(rope.config, T))


def test_shifting_positions_leaves_output_unchanged(monkeypatch):
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=0))
    spread_positions(model)
    ids = _ids()
    reference = model(ids).logits
    predict = RepoSequentialBlock.predict_positions
    monkeypatch.setattr(RepoSequentialBlock, "predict_positions", lambda self, x: predict(self, x) + 37.25)
    shifted = model(ids).logits
    # Two fp32 results; the shifted angles are rounded to eps * |z + 37.25| radians in each of the 4 layers.
    largest = max(z.abs().max() for z in predict_positions(model, ids).values()) + 37.25
    roundings = 2 * model_roundings(model.config, T) + 4 * 2 * largest
    assert_within(shifted, reference, roundings=roundings, what="shifted logits")
    # ... while a per-head change of positions does change it (the positions are used at all).
    monkeypatch.setattr(RepoSequentialBlock, "predict_positions", lambda self, x: predict(self, x) * 2)
    with pytest.raises(AssertionError, match="exceeds the bound"):
        assert_within(model(ids).logits, reference, roundings=roundings)


def test_nope_layers_apply_no_rotation(monkeypatch):
    nope = build_model(tiny_config(pe_mode="nope"))
    assert all(
        type(b) is RepoSequentialBlock and b.pe_mode == PositionMode.nope for b in nope.transformer.blocks
    )
    rope = build_model(tiny_config())
    rope.load_state_dict(nope.state_dict())
    ids = _ids()
    assert (nope(ids).logits - rope(ids).logits).abs().max() > 1e-4
    monkeypatch.setattr(RotaryEmbedding, "forward", lambda self, q, k: (q, k))  # stock model without rotation
    assert_within(nope(ids).logits, rope(ids).logits, roundings=2 * model_roundings(nope.config, T))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (dict(pe_mode="repo", pe_start_layer=2), "RRPPPP"),
        (dict(pe_mode="nope"), "NNNNNN"),
        (dict(pe_mode="nope", pe_layer_ids=[2, 5]), "RRNRRN"),  # R2N1
        (dict(pe_mode="nope", pe_layer_ids=[0, 1, 3, 4]), "NNRNNR"),  # N2R1
        (dict(pe_mode="repo", pe_start_layer=2, pe_layer_ids=[0, 3, 5]), "RRRPRP"),
    ],
)
def test_layers_get_exactly_the_configured_mode(overrides, expected):
    config = tiny_config(n_layers=6, **overrides)
    letter = {PositionMode.rope: "R", PositionMode.nope: "N", PositionMode.repo: "P"}
    assert "".join(letter[m] for m in layer_modes(config)) == expected
    model = build_model(config)
    for block, want in zip(model.transformer.blocks, expected):
        if want == "R":
            assert type(block) is OLMoSequentialBlock
        else:
            assert type(block) is RepoSequentialBlock and letter[block.pe_mode] == want
            assert hasattr(block, "final_map") == (want == "P")
    assert repo_layer_ids(config) == [i for i, c in enumerate(expected) if c == "P"]


def _grads(model: OLMo, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(ids).logits.pow(2).mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("strategy", [None, "whole_layer", "fine_grained"])
def test_gradients_reach_f_phi_under_activation_checkpointing(strategy):
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=1))
    spread_positions(model)
    ids = _ids()
    plain = _grads(model, ids)
    model.set_activation_checkpointing(strategy and ActivationCheckpointingStrategy(strategy))
    grads = _grads(model, ids)
    for layer in repo_layer_ids(model.config):
        for name in ("gate_map", "content_map", "final_map"):
            key = f"transformer.blocks.{layer}.{name}.weight"
            assert key in grads and grads[key].abs().sum() > 0, key
    assert grads.keys() == plain.keys()
    roundings = 2 * model_roundings(model.config, T, batch_tokens=B * T)  # two fp32 results
    for key in plain:
        assert_within(grads[key], plain[key], roundings=roundings, what=f"gradient of {key}")


def test_positions_are_trained_end_to_end(monkeypatch):
    """f_phi's gradient flows through cos/sin: it matches finite differences of the loss, and autograd
    through the plain formula (materialised cos/sin) gives the same gradients as the efficient path."""
    fp32 = build_model(tiny_config(pe_mode="repo", n_layers=2))
    spread_positions(fp32)
    ids = _ids(8)
    with float64_truth(fp32) as model:
        w = model.transformer.blocks[1].final_map.weight

        def loss() -> torch.Tensor:
            return model(ids).logits.pow(2).mean()

        grads = _grads(model, ids)
        direction = torch.randn_like(w)
        # Central differences: truncation error ~ h^2 x the third derivative, rounding ~ eps64 |f| / h.
        h = 1e-4
        with torch.no_grad():
            w += h * direction
            up = loss()
            w -= 2 * h * direction
            down = loss()
            w += h * direction
        numeric = (up - down) / (2 * h)
        analytic = (grads["transformer.blocks.1.final_map.weight"] * direction).sum()
        torch.testing.assert_close(analytic, numeric, rtol=1e-6, atol=0)

        _plain_rotation(monkeypatch)
        plain = _grads(model, ids)
    roundings = 2 * model_roundings(model.config, 8, batch_tokens=B * 8)
    for key in grads:
        assert_within(grads[key], plain[key], roundings=roundings, what=f"gradient of {key}")


def _plain_rotation(monkeypatch) -> None:
    monkeypatch.setattr(
        "olmo_repo.rope.rotate_qk",
        lambda q, k, z, f, **_: (rotate_reference(q, z, f), rotate_reference(k, z, f)),
    )


class _FlipGrad(torch.autograd.Function):
    """Identity forward, negated backward: a sign error in dL/dz."""

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        return z.view_as(z)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return -grad


_ROTATIONS = {  # what RepoLayer.apply_positions calls as rotate_qk(q, k, positions, inv_freq, compiled=None)
    "eager": lambda compiled: lambda q, k, z, f, **_: rotate_qk(q, k, z, f, compiled=compiled),
    "off by one position": lambda compiled: (
        lambda q, k, z, f, **_: (
            rotate(q, z + 1, f, compiled=compiled),  # queries one position ahead of their keys
            rotate(k, z, f, compiled=compiled),
        )
    ),
    "sign flip in dL/dz": lambda compiled: (
        lambda q, k, z, f, **_: rotate_qk(q, k, _FlipGrad.apply(z), f, compiled=compiled)
    ),
}


def _check_rotation_against_float64_truth(monkeypatch, strategy: str | None, compiled: bool, rotation: str):
    """Logits, gradients and a cached decoding step of the model with `rotation` (fp32, eager or through
    torch.compile) against the plain formula in float64, within fp32 bounds from the model's reductions."""
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=1))
    spread_positions(model)
    ids = _ids()
    with monkeypatch.context() as m:
        m.setattr("olmo_repo.rope.rotate_qk", _ROTATIONS[rotation](compiled))
        model.set_activation_checkpointing(strategy and ActivationCheckpointingStrategy(strategy))
        logits, grads = model(ids).logits, _grads(model, ids)
        with torch.no_grad():
            out = model(ids[:, :-1], use_cache=True)
            step = model(ids[:, -1:], past_key_values=out.attn_key_values).logits
    with float64_truth(model) as truth, monkeypatch.context() as m:
        _plain_rotation(m)
        true_logits, true_grads = truth(ids).logits, _grads(truth, ids)
    forward = model_roundings(model.config, T)
    assert_within(logits, true_logits, roundings=forward, what="logits")
    assert_within(step, true_logits[:, -1:], roundings=forward, what="cached decoding step")
    assert grads.keys() == true_grads.keys()
    backward = model_roundings(model.config, T, batch_tokens=B * T)
    for key in true_grads:
        assert_within(grads[key], true_grads[key], roundings=backward, what=f"gradient of {key}")


@pytest.mark.parametrize(
    "rotation", ["eager", pytest.param("compiled", marks=pytest.mark.slow)]
)  # compiled: what CUDA runs, here for CPU
@pytest.mark.parametrize("strategy", [None, "whole_layer", "fine_grained"])
def test_efficient_rotation_matches_float64_truth_in_the_model(monkeypatch, strategy, rotation):
    _check_rotation_against_float64_truth(monkeypatch, strategy, rotation == "compiled", "eager")


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "bug, caught_in",
    [("off by one position", "logits"), ("sign flip in dL/dz", "gradient of")],
)
def test_the_float64_comparison_catches_real_errors(monkeypatch, bug, caught_in, compiled):
    with pytest.raises(AssertionError, match=f"^{caught_in}.*exceeds the bound"):
        _check_rotation_against_float64_truth(monkeypatch, None, compiled, bug)


@pytest.mark.slow  # inductor compiles
def test_the_compiled_rotation_compiles_and_a_failed_compile_falls_back_to_eager(monkeypatch):
    q, k = torch.randn(2, 3, 9, 8, requires_grad=True), torch.randn(2, 3, 9, 8)
    z, inv_freq = (torch.randn(2, 3, 9) * 10).requires_grad_(), inv_frequencies(8, 1000.0)
    expected = rotate_qk(q, k, z, inv_freq, compiled=False)
    compiled = rotate_qk(q, k, z, inv_freq, compiled=True)
    roundings = rotation_roundings(z, inv_freq)
    for x, out in zip((q, k), compiled):
        truth = rotate_reference(x.double(), z.double(), inv_freq.double())
        assert_within(
            out, truth, roundings=roundings, magnitude=rotation_magnitude(x), what="compiled rotation"
        )
    grad_q, grad_z = torch.autograd.grad(sum(compiled).sum(), (q, z))
    qd, zd = q.detach().double().requires_grad_(), z.detach().double().requires_grad_()
    true_q, true_z = torch.autograd.grad(
        (
            rotate_reference(qd, zd, inv_freq.double()) + rotate_reference(k.double(), zd, inv_freq.double())
        ).sum(),
        (qd, zd),
    )
    # dL/dq = R^T g with g = 1: magnitude |g1| + |g2| = 2.
    assert_within(grad_q, true_q, roundings=roundings, magnitude=2.0, what="compiled dL/dq")
    # dL/dz = sum_k f_k (g2 o1 - g1 o2) over d/2 pairs of q and k each, with o off by `roundings`.
    magnitude = 2 * inv_freq.double().sum() * (rotation_magnitude(q) + rotation_magnitude(k)).amax(-1)
    assert_within(grad_z, true_z, roundings=roundings + 8, magnitude=magnitude, what="compiled dL/dz")
    assert all(c.compiled is not None and not c.failed for c in COMPILED_ROTATION)
    q, z = q.detach(), z.detach()

    def broken_compile(fn, **kwargs):
        def raise_(*args):
            raise RuntimeError("no C++ compiler")

        return raise_

    monkeypatch.setattr(torch, "compile", broken_compile)
    compiled_forward = COMPILED_ROTATION[0]
    fallback = type(compiled_forward)(compiled_forward.fn)  # a fresh one: not yet compiled, not yet failed
    with pytest.warns(UserWarning, match="torch.compile of rotate_forward failed.*no C\\+\\+ compiler"):
        out = fallback(z, inv_freq, [q, k])
    assert fallback.failed and all(torch.equal(a, b) for a, b in zip(out, expected))
    assert all(torch.equal(a, b) for a, b in zip(fallback(z, inv_freq, [q, k]), expected))  # warned once


def test_olmo_optimizer_groups_accept_the_model_and_decay_f_phi():
    from olmo.optim import build_optimizer

    from olmo_repo import RepoTrainConfig

    cfg = RepoTrainConfig(model=tiny_config(pe_mode="repo", pe_start_layer=1))
    cfg.optimizer.weight_decay = 0.1
    model = build_model(cfg.model)
    optim = build_optimizer(cfg, model)
    names = {n for g in optim.param_groups for n in g["param_names"]}
    assert names == {n for n, _ in model.named_parameters()}
    decayed = {n for g in optim.param_groups if g["weight_decay"] > 0 for n in g["param_names"]}
    for layer in repo_layer_ids(cfg.model):
        for name in ("gate_map", "content_map", "final_map"):
            assert f"transformer.blocks.{layer}.{name}.weight" in decayed


def test_f_phi_uses_olmo_truncated_normal_init():
    model = build_model(tiny_config(d_model=512, n_heads=8, n_layers=1, pe_mode="repo"))
    block = model.transformer.blocks[0]
    assert block.gate_map.weight.shape == (64, 512) and block.content_map.weight.shape == (64, 512)
    assert block.final_map.weight.shape == (8, 64)
    assert block.gate_map.bias is None and block.final_map.bias is None
    for linear in (block.gate_map, block.content_map):
        w = linear.weight
        assert w.abs().max() <= 0.06 + 1e-7  # cut off at 3 std
        assert 0.017 < w.std() < 0.02  # a normal truncated at 3 sigma has std 0.986 sigma


@pytest.mark.parametrize(
    "overrides",
    [
        dict(pe_mode="repo", pe_start_layer=1),
        dict(pe_mode="nope"),
        dict(pe_mode="nope", pe_layer_ids=[1, 3]),
        dict(pe_mode="repo", pe_layer_ids=[0, 2]),
        dict(pe_mode="repo", pe_start_layer=1, n_kv_heads=2),  # grouped-query attention
        dict(pe_mode="repo", pe_start_layer=1, n_kv_heads=1),  # multi-query
    ],
)
@pytest.mark.parametrize("block_group_size", [1, 2])
def test_kv_cache_incremental_decode_equals_full_forward(overrides, block_group_size):
    model = build_model(tiny_config(block_group_size=block_group_size, **overrides)).eval()
    spread_positions(model)
    ids = _ids(20)
    full = model(ids).logits
    with torch.no_grad():
        out = model(ids[:, :12], use_cache=True)
        pieces, past = [out.logits], out.attn_key_values
        for t in range(12, 20):
            out = model(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            pieces.append(out.logits)
            past = out.attn_key_values
    # Two fp32 computations of the same logits, with differently shaped (so differently ordered) kernels.
    assert_within(torch.cat(pieces, dim=1), full, roundings=2 * model_roundings(model.config, 20))


def _decode(model: OLMo, ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """The logits of `ids` [B, T]: a forward of the first `prefix` tokens, then one token at a time through the
    KV cache (offsets prefix..T-1)."""
    with torch.no_grad():
        out = model(ids[:, :prefix], use_cache=True)
        pieces, past = [out.logits], out.attn_key_values
        for t in range(prefix, ids.shape[1]):
            out = model(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            pieces.append(out.logits)
            past = out.attn_key_values
    return torch.cat(pieces, dim=1)


def test_at_p_one_repo_layers_inserted_into_a_rope_model_give_its_logits_bit_for_bit():
    """The index blend's warm start: at p = 1 a RePo model (f_phi non-zero) scores as the RoPE model it was
    made from, bit for bit in fp32, also decoding through the KV cache (the index is past + 0..T-1, as OLMo's
    RoPE counts it); the token index as the positions (`position_source`) gives the same, no positions the NoPE
    model's logits."""
    rope = build_model(tiny_config()).eval()
    repo = build_model(tiny_config(pe_mode="repo", pe_start_layer=1)).eval()
    _copy_base(repo, rope)
    spread_positions(repo)
    ids = _ids(20)
    with torch.no_grad():
        expected = rope(ids).logits
        assert not torch.equal(repo(ids).logits, expected)  # p = 0: f_phi's positions
        set_index_blend(repo, 1.0)
        assert torch.equal(repo(ids).logits, expected)
    assert torch.equal(_decode(repo, ids, 12), _decode(rope, ids, 12))
    set_index_blend(repo, 0.0)
    for block in repo_blocks(repo):
        block.position_source = PositionSource.index
    with torch.no_grad():
        assert torch.equal(repo(ids).logits, expected)
        nope = build_model(tiny_config(pe_mode="nope", pe_start_layer=1)).eval()
        _copy_base(nope, rope)
        for block in repo_blocks(repo):
            block.position_source = PositionSource.constant
        assert torch.equal(repo(ids).logits, nope(ids).logits)


def test_kv_cache_decode_at_p_half_equals_the_full_forward_and_not_at_another_p():
    """p = 0.5 with trained-looking f_phi, decoding at offsets 12..19: the full forward's logits within fp32
    bounds, and outside them of p = 0 and p = 1 (a blend that ignored p, or the cache's offset, fails)."""
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=1)).eval()
    spread_positions(model)
    ids = _ids(20)

    def full(p: float) -> torch.Tensor:
        set_index_blend(model, p)
        with torch.no_grad():
            return model(ids).logits

    largest = max(z.abs().max() for z in predict_positions(model, ids).values()) + 20
    # Two fp32 computations (kernels of other shapes); angles rounded to eps * |position| in 3 RePo layers.
    roundings = 2 * model_roundings(model.config, 20) + 3 * 2 * largest
    set_index_blend(model, 0.5)
    decoded = _decode(model, ids, 12)
    assert_within(decoded, full(0.5), roundings=roundings, what="decoded logits at p = 0.5")
    for p in (0.0, 1.0):
        with pytest.raises(AssertionError, match="exceeds the bound"):
            assert_within(decoded, full(p), roundings=roundings)


def test_predict_positions_returns_the_per_head_positions_of_every_repo_layer():
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=2))
    spread_positions(model)
    ids = _ids()
    positions = predict_positions(model, ids)
    assert sorted(positions) == [2, 3]
    assert all(p.shape == (B, 4, T) and p.dtype == torch.float32 for p in positions.values())
    # They are what the forward used: the input of block 2 is the output of block 1.
    x = model.transformer.wte(ids)
    for block in model.transformer.blocks[:2]:
        x, _ = block(x)
    torch.testing.assert_close(positions[2], model.transformer.blocks[2].predict_positions(x))


def test_positions_are_fp32_results_of_bf16_inputs_under_bf16_autocast():
    """Under autocast gate_map/content_map see bf16 inputs (like every projection) but return fp32: the
    positions equal float64 math on the bf16-rounded x and weights, where bf16 outputs lose whole positions."""
    model = build_model(tiny_config(d_model=256, n_heads=4, n_layers=1, pe_mode="repo"))
    block = model.transformer.blocks[0]
    for linear in (block.gate_map, block.content_map, block.final_map):
        torch.nn.init.normal_(linear.weight, std=2.0)  # positions in the thousands
    x = torch.randn(1, 64, 256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = block.predict_positions(x)
        z_bf16 = block.final_map(
            torch.nn.functional.silu(block.gate_map(x)) * block.content_map(x)
        ).transpose(1, 2)
    assert z.dtype == torch.float32

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.bfloat16().double()

    F = torch.nn.functional
    x64, wg, wc = rounded(x), rounded(block.gate_map.weight), rounded(block.content_map.weight)
    wf = block.final_map.weight.double()
    gate, content = F.linear(x64, wg), F.linear(x64, wc)
    exact = F.linear(F.silu(gate) * content, wf).transpose(1, 2)
    assert exact.abs().max() > 1000
    # First-order fp32 error bound: gate and content sum 256 exact bf16 products in fp32 (error <= 256 eps
    # x the sum of |products|), SiLU and the product round once each (|SiLU'| <= 1.1), final_map sums 32 more.
    gate_mag, content_mag = F.linear(x64.abs(), wg.abs()), F.linear(x64.abs(), wc.abs())
    product = (
        1.1 * content.abs() * gate_mag + F.silu(gate).abs() * content_mag + (F.silu(gate) * content).abs()
    )
    magnitude = F.linear(product, wf.abs()).transpose(1, 2)
    assert_within(z, exact, roundings=256 + 32 + 2, magnitude=magnitude, what="fp32 positions")
    with pytest.raises(AssertionError, match="exceeds the bound"):  # what the reference's bf16 matmuls lose
        assert_within(z_bf16.float(), exact, roundings=256 + 32 + 2, magnitude=magnitude)


def test_f_phi_without_autograd_gives_the_same_positions():
    """Inference (no_grad, inference_mode: vLLM, HF generate) skips `LinearFp32Out`'s autograd wrapper: the same
    bits. Where only the weights need a gradient (x does not) the wrapper runs and the gradients arrive."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 5, 64, generator=gen).bfloat16()
    shapes = [(16, 64), (16, 64), (4, 16)]
    weights = [torch.randn(s, generator=gen).bfloat16().requires_grad_() for s in shapes]
    z = f_phi(x, *weights)
    grads = torch.autograd.grad(z.square().sum(), weights)
    assert all(g.dtype == torch.bfloat16 and g.abs().sum() > 0 for g in grads)
    with torch.no_grad():
        assert torch.equal(f_phi(x, *weights), z.detach())
    with torch.inference_mode():
        assert torch.equal(f_phi(x, *weights), z.detach())


def test_low_precision_projection_gradients_match_autograd_of_the_fp32_formula():
    """`LinearFp32Out`'s backward: the gradient rounded to bf16, then bf16 matmuls (as autocast's)."""
    from olmo_repo.rope import LinearFp32Out

    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(16, 64, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 8, 16)
    out = LinearFp32Out.apply(x, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.nn.functional.linear(x.float(), w.float()), rtol=0, atol=0)
    grad_x, grad_w = torch.autograd.grad(out, (x, w), g)
    assert grad_x.dtype == grad_w.dtype == torch.bfloat16
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    gd = g.bfloat16().double()
    ex, ew = torch.autograd.grad(torch.nn.functional.linear(xd, wd), (xd, wd), gd)
    # bf16 matmuls of bf16-exact inputs: the products are exact, the sum accumulates in fp32 (16 terms each,
    # negligible) and the result rounds to bf16 once; 2 bf16 roundings of the sum of |products| cover both.
    assert_within(grad_x, ex, roundings=2, magnitude=gd.abs() @ wd.detach().abs(), what="dL/dx")
    assert_within(
        grad_w, ew, roundings=2, magnitude=gd.abs().flatten(0, 1).t() @ xd.detach().abs().flatten(0, 1)
    )


def test_f_phi_under_autocast_gives_fp32_master_weights_fp32_gradients():
    block = build_model(tiny_config(n_layers=1, pe_mode="repo")).transformer.blocks[0]
    x = torch.randn(2, 16, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = block.predict_positions(x)
    z.pow(2).sum().backward()
    for linear in (block.gate_map, block.content_map, block.final_map):
        assert linear.weight.grad.dtype == torch.float32 and linear.weight.grad.abs().sum() > 0
    assert x.grad.dtype == torch.float32 and x.grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["bf16 model", "fp32 model under autocast"])
def test_f_phi_is_recomputed_in_backward_in_mixed_precision(case):
    """In mixed precision autograd keeps only the block input x at the compute precision for f_phi (a bf16 x
    itself; an fp32 x's bf16 cast, half its bytes); gradients equal the direct path."""
    block = build_model(tiny_config(n_layers=1, pe_mode="repo")).transformer.blocks[0]
    dtype = torch.bfloat16 if case == "bf16 model" else torch.float32
    block = block.to(dtype)
    x = torch.randn(2, 16, 64, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 4, 16)
    saved: list[torch.Tensor] = []
    weights = (x, block.gate_map.weight, block.final_map.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case != "bf16 model"):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            z = block.predict_positions(x)
        grads = torch.autograd.grad(z, weights, g)
        direct = torch.autograd.grad(
            f_phi(x, block.gate_map.weight, block.content_map.weight, block.final_map.weight), weights, g
        )
    assert z.dtype == torch.float32
    kept = [t for t in saved if t.numel() >= 256]
    assert len(kept) == 1 and kept[0].dtype == torch.bfloat16 and torch.equal(kept[0], x.detach().bfloat16())
    assert (kept[0].data_ptr() == x.data_ptr()) == (case == "bf16 model")
    for a, b in zip(grads, direct):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_inv_frequencies_cached_under_inference_mode_still_train():
    from olmo_repo.rotation import inv_frequencies

    inv_frequencies.cache_clear()
    model = build_model(tiny_config(pe_mode="repo"))
    with torch.inference_mode():
        model(_ids())
    model(_ids()).logits.sum().backward()  # an inference tensor in the cache would fail here
    grads = [p.grad for p in model.transformer.blocks[0].final_map.parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_bf16_autocast_training_step_runs():
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(_ids()).logits.float().pow(2).mean()
    loss.backward()
    assert torch.isfinite(model.transformer.blocks[1].final_map.weight.grad).all()


def _expand_kv_heads(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights of a grouped-query model as a multi-head one computing the same function, by hand: every
    key/value head's rows of att_proj (k and v), of k_norm and of final_map copied to each query head of its
    group (k_norm is an RMS norm over all key heads, which copies leave unchanged)."""
    H, n_kv, hd = config.n_heads, config.effective_n_kv_heads, config.d_model // config.n_heads
    group = H // n_kv
    out = {}
    for key, w in state.items():
        name = key.rsplit(".", 2)[-2] if "blocks" in key else None
        if name == "att_proj":
            q, k, v = w.split([H * hd, n_kv * hd, n_kv * hd])
            k, v = (t.unflatten(0, (n_kv, hd)).repeat_interleave(group, 0).flatten(0, 1) for t in (k, v))
            w = torch.cat([q, k, v])
        elif name == "k_norm":
            w = w.unflatten(0, (n_kv, hd)).repeat_interleave(group, 0).flatten()
        elif name == "final_map":
            w = w.repeat_interleave(group, 0)  # [n_kv, d/8] -> [H, d/8]: each query head its group's position
        out[key] = w
    return out


@pytest.mark.parametrize("n_kv", [2, 1])  # grouped-query, multi-query
def test_grouped_query_repo_equals_float64_multi_head_with_keys_expanded_by_hand(n_kv):
    """GQA RePo: each query head scores with its group's key and position, q_i^T R(z_j^g - z_i^g) k_j. The
    fp32 grouped model against the float64 multi-head model whose keys, values and positions are the grouped
    ones copied to every query head: logits, gradients of the shared weights and a cached decoding step."""
    gqa = build_model(tiny_config(pe_mode="repo", pe_start_layer=1, n_kv_heads=n_kv))
    spread_positions(gqa)
    mha = build_model(tiny_config(pe_mode="repo", pe_start_layer=1))
    mha.load_state_dict(_expand_kv_heads(gqa.state_dict(), gqa.config))
    ids = _ids()
    positions = predict_positions(gqa, ids)
    assert all(z.shape == (B, n_kv, T) for z in positions.values())
    with float64_truth(mha) as truth:
        true_logits = truth(ids).logits
        true_grads = _grads(truth, ids)
        true_positions = predict_positions(truth, ids)
    with float64_truth(gqa) as gqa64:
        positions64 = predict_positions(gqa64, ids)
    for layer, z in positions64.items():  # the expanded model's query heads carry their group's position
        # Two float64 f_phi (final_map's GEMM of n_kv or 4 rows may sum its d/8 terms in another order).
        expanded = z.repeat_interleave(4 // n_kv, dim=1)
        assert_within(
            expanded, true_positions[layer], roundings=4 * (64 + 8), what=f"positions of layer {layer}"
        )
    forward = model_roundings(gqa.config, T)
    assert_within(gqa(ids).logits, true_logits, roundings=forward, what="GQA logits")
    grads = _grads(gqa, ids)
    backward = model_roundings(gqa.config, T, batch_tokens=B * T)
    for key in (
        "transformer.wte.weight",
        "transformer.blocks.2.final_map.weight",
        "transformer.blocks.3.attn_out.weight",
    ):
        want = true_grads[key] if "final_map" not in key else true_grads[key].unflatten(0, (n_kv, -1)).sum(1)
        assert_within(grads[key], want, roundings=backward, what=f"gradient of {key}")
    with torch.no_grad():
        out = gqa(ids[:, :-1], use_cache=True)
        assert out.attn_key_values[2][0].shape == (B, n_kv, T - 1, 16)  # the cache keeps its grouped size
        step = gqa(ids[:, -1:], past_key_values=out.attn_key_values).logits
    assert_within(step, true_logits[:, -1:], roundings=forward, what="cached decoding step")
