"""The rule set of learning positions (`olmo_repo.modes`, `olmo_repo.rope`): the index blend's schedule and
arithmetic, the evaluation-time replacement of positions, the statistics both trainers log, and the checks of
the new keys. The backends' tests take the same rules through each trainer, HF and vLLM."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from olmo_repo.modes import (
    PE_KEYS,
    SCORED_PE_KEYS,
    FPhiTraining,
    PositionKeys,
    ScoredPositionKeys,
    check_index_blend,
    check_pe_keys,
    check_scored_positions,
    index_blend,
    is_f_phi_param,
)
from olmo_repo.positions import position_stats, spread
from olmo_repo.rope import RepoLayer, blend_positions, set_index_blend

D, HD, THETA, T = 64, 16, 10_000.0, 12


class Layer(RepoLayer, nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.init_repo("repo", layer_id=3, d_model=D, n_kv_heads=2, head_dim=HD, rope_theta=THETA, **kwargs)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for w in self.f_phi_weights():
                w.copy_(torch.randn(w.shape, generator=gen))  # trained-looking: positions in the tens


def _inputs(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, D, generator=gen)
    q, k = torch.randn(2, 4, T, HD, generator=gen), torch.randn(2, 2, T, HD, generator=gen)
    return x, q, k


def test_the_schedule_falls_linearly_from_its_init_to_zero_and_zero_steps_means_no_blend():
    assert [index_blend(1.0, 4, s) for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert index_blend(0.6, 3, 1) == pytest.approx(0.4, abs=1e-15)
    assert index_blend(1.0, 0, 0) == 0.0  # the reference's rule: no anneal length, no blend


def test_the_blend_is_the_index_exactly_at_one_and_the_positions_themselves_at_zero():
    z = torch.randn(2, 2, T) * 50
    index = torch.arange(7, 7 + T)  # after a KV cache's past of 7 tokens
    assert torch.equal(blend_positions(z, index, 1.0), index.float().expand(2, 2, T))
    assert blend_positions(z, index, 0.0) is z
    half = blend_positions(z.double(), index, 0.5)
    assert torch.allclose(half, 0.5 * z.double() + 0.5 * index.double(), rtol=0, atol=1e-12)


def test_at_p_one_a_repo_layer_rotates_as_rope_and_at_p_half_by_the_blend():
    x, q, k = _inputs()
    index = torch.arange(5, 5 + T)  # a non-zero offset: the index is the absolute position
    rope = Layer(position_source="index").reposition(x, q, k, index=index)
    layer = Layer(index_blend=1.0)
    assert all(torch.equal(a, b) for a, b in zip(layer.reposition(x, q, k, index=index), rope))
    layer.index_blend = 0.5
    z = layer.predict_positions(x)
    want = layer.apply_positions(q, k, 0.5 * z + 0.5 * index.float())
    got = layer.reposition(x, q, k, index=index)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    learned = Layer().reposition(x, q, k, index=index)
    assert not torch.allclose(got[0], learned[0]) and not torch.allclose(got[0], rope[0])


def test_constant_positions_rotate_nothing_and_the_gradient_into_f_phi_scales_with_one_minus_p():
    x, q, k = _inputs()
    assert all(
        torch.equal(a, b) for a, b in zip(Layer(position_source="constant").reposition(x, q, k), (q, k))
    )
    grads = {}
    for p in (0.0, 0.75):
        layer = Layer(index_blend=p)
        out_q, out_k = layer.reposition(x, q, k, index=torch.arange(T))
        (out_q.square().sum() + out_k.sum()).backward()
        grads[p] = layer.final_map.weight.grad
    assert grads[0.75].abs().sum() > 0 and not torch.allclose(grads[0.75], grads[0.0])


def test_set_index_blend_reaches_every_repo_layer_and_the_statistics_report_it():
    model = nn.Sequential(Layer(), Layer())
    set_index_blend(model, 0.25)
    assert [m.index_blend for m in model] == [0.25, 0.25]
    x, q, k = _inputs()
    with position_stats(model) as stats:
        model[0].reposition(x, q, k, index=torch.arange(T))
    assert stats["train/positions/index_blend"] == 0.25
    assert {key.rsplit("/", 1)[1] for key in stats if "layer3" in key} == {
        "min",
        "max",
        "std",
        "p05",
        "p95",
        "rank_corr",
    }


def test_spread_and_rank_correlation_against_a_float64_oracle():
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(3, 2, 40, generator=gen, dtype=torch.float64)
    got = spread(z)
    flat = z.flatten().sort().values
    for q, key in ((0.05, "p05"), (0.95, "p95")):
        pos = q * (flat.numel() - 1)
        lo = flat[math.floor(pos)] + (pos - math.floor(pos)) * (flat[math.ceil(pos)] - flat[math.floor(pos)])
        assert got[key] == pytest.approx(lo.item(), rel=1e-6)
    # Spearman: Pearson of ranks, by hand in float64
    rows = z.reshape(-1, 40)
    ranks = torch.empty_like(rows)
    for r, row in enumerate(rows):
        ranks[r, row.argsort()] = torch.arange(40, dtype=torch.float64)
    idx = torch.arange(40, dtype=torch.float64)
    rho = [torch.corrcoef(torch.stack([r, idx]))[0, 1].item() for r in ranks]
    assert got["rank_corr"] == pytest.approx(sum(rho) / len(rho), abs=1e-6)
    assert spread(torch.arange(9.0).view(1, 1, 9))["rank_corr"] == pytest.approx(1.0)
    assert spread(torch.full((1, 1, 9), 3.0))["rank_corr"] == 0.0  # a constant row is no ordering


@pytest.mark.parametrize(
    "init, steps, has_repo, bad",
    [
        (1.5, 10, True, "pe_blend_init=1.5"),
        (-0.1, 10, True, "pe_blend_init=-0.1"),
        (float("nan"), 10, True, "pe_blend_init=nan"),
        (0.5, -1, True, "pe_blend_steps=-1"),
        (0.5, 2.5, True, "pe_blend_steps=2.5"),
        (0.5, 10, False, "this model has none"),
        (1.0, 0, True, "pe_blend_init=1.0 with model.pe_blend_steps=0 is no blend"),
    ],
)
def test_bad_blend_values_are_one_line_naming_the_key(init, steps, has_repo, bad):
    with pytest.raises(ValueError, match=bad) as e:
        check_index_blend(init, steps, has_repo=has_repo, prefix="model.", training=True)
    assert "\n" not in str(e.value) and "model." in str(e.value)
    check_index_blend(0.0, 0, has_repo=False, training=True)  # the paper's: off
    check_index_blend(1.0, 0, has_repo=False)  # a model's config (the reference's rule): no anneal, no blend


@pytest.mark.parametrize(
    "kwargs, has_repo, bad",
    [
        (dict(lr_multiplier=0.0), True, "lr_multiplier=0.0"),
        (dict(lr_multiplier=-2.0), True, "lr_multiplier=-2.0"),
        (dict(lr_multiplier=float("inf")), True, "lr_multiplier=inf"),
        (dict(weight_decay=-0.1), True, "weight_decay=-0.1"),
        (dict(weight_decay=float("nan")), True, "weight_decay=nan"),
        (dict(only=True), False, "no RePo layer"),
    ],
)
def test_bad_f_phi_training_values_are_one_line_naming_the_key(kwargs, has_repo, bad):
    with pytest.raises(ValueError, match=bad) as e:
        FPhiTraining(**kwargs).check(has_repo=has_repo)
    assert "\n" not in str(e.value) and str(e.value).startswith("f_phi.")
    FPhiTraining(lr_multiplier=30.0, weight_decay=0.0, only=True).check(has_repo=True)


def test_bad_scored_positions_are_one_line_naming_the_key():
    for args, bad in (((1.2, "learned"), "pe_blend=1.2"), ((0.0, "rope"), "pe_positions='rope'")):
        with pytest.raises(ValueError, match=bad):
            check_scored_positions(*args, has_repo=True)
    with pytest.raises(ValueError, match="pe_positions=index acts on the positions of RePo layers"):
        check_scored_positions(0.0, "index", has_repo=False)
    check_scored_positions(1.0, "constant", has_repo=True)


def test_the_keys_are_declared_once_and_a_misspelt_one_is_named():
    assert PE_KEYS == tuple(PositionKeys.__dataclass_fields__)
    assert SCORED_PE_KEYS == (*PE_KEYS, "pe_blend", "pe_positions")
    assert ScoredPositionKeys().pe_positions == "learned" and PositionKeys().pe_blend_steps == 0
    with pytest.raises(ValueError, match="did you mean 'pe_blend_init'"):
        check_pe_keys(["pe_blend_inti"], "config.json")
    check_pe_keys(["pe_blend", "pe_positions", "hidden_size"], "config.json")


def test_f_phi_parameters_are_named_as_every_checkpoint_names_them():
    assert is_f_phi_param("transformer.blocks.5.gate_map.weight")
    assert is_f_phi_param("_fsdp_wrapped_module.blocks.3.attention.final_map.weight")
    assert is_f_phi_param("model.layers.9.self_attn.content_map.weight")
    assert not is_f_phi_param("blocks.3.attention.w_q.weight") and not is_f_phi_param("gate_map")
