"""The one RePo layer core (`olmo_repo.rope.RepoLayer`) that every backend mixes in: f_phi's weights, the
rotation with key/value-head positions shared by their query groups, YaRN's factor, the observation hook."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from olmo_repo.modes import F_PHI_HIDDEN_RATIO, PositionMode
from olmo_repo.rope import RepoLayer, f_phi, observe_positions, record_positions, repo_layers
from olmo_repo.rotation import inv_frequencies, rotate_qk, rotate_reference

from .numerics import assert_within, rotation_magnitude, rotation_roundings

D, HD, THETA = 64, 16, 10_000.0


class Layer(RepoLayer, nn.Module):
    """The smallest owner of the core: nothing but `init_repo`."""

    def __init__(self, mode: str = "repo", n_kv: int = 4, layer_id: int = 0, **kwargs):
        super().__init__()
        self.init_repo(
            mode, layer_id=layer_id, d_model=D, n_kv_heads=n_kv, head_dim=HD, rope_theta=THETA, **kwargs
        )


def _spread(layer: Layer, seed: int = 0) -> Layer:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in layer.f_phi_weights():
            w.copy_(torch.randn(w.shape, generator=gen))  # positions in the tens
    return layer


def test_repo_layer_adds_f_phi_to_its_owner_under_the_checkpoint_names():
    layer = Layer(n_kv=2)
    hidden = D // F_PHI_HIDDEN_RATIO
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == {
        "gate_map.weight": (hidden, D),
        "content_map.weight": (hidden, D),
        "final_map.weight": (2, hidden),  # one position per key/value head
    }
    assert isinstance(layer.positions_out, nn.Identity)
    for mode in ("nope", "rope"):
        other = Layer(mode)
        assert other.pe_mode == PositionMode(mode) and not other.state_dict() and not repo_layers(other)


@pytest.mark.parametrize("n_kv", [4, 2, 1])  # MHA, GQA (2 query heads per KV head), multi-query
def test_grouped_rotation_equals_positions_expanded_to_every_query_head(n_kv):
    """Each query head is rotated by its key/value head's position: against the plain formula in float64 with
    the positions expanded to every query head by hand, values and gradients (the positions' gradient sums
    over the group)."""
    B, H, T = 2, 4, 11
    layer = _spread(Layer(n_kv=n_kv))
    x = torch.randn(B, T, D)
    q = torch.randn(B, H, T, HD, requires_grad=True)
    k = torch.randn(B, n_kv, T, HD, requires_grad=True)
    z = layer.predict_positions(x)  # [B, n_kv, T]
    assert z.shape == (B, n_kv, T) and z.dtype == torch.float32 and z.abs().max() > 5
    z = z.detach().requires_grad_()
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    rq, rk = layer.apply_positions(q, k, z)
    grads = torch.autograd.grad((rq * gq).sum() + (rk * gk).sum(), (q, k, z))

    inv_freq = inv_frequencies(HD, THETA).double()
    qd, kd, zd = (t.detach().double().requires_grad_() for t in (q, k, z))
    z_per_query_head = zd.repeat_interleave(H // n_kv, dim=1)  # [B, H, T], by hand
    tq, tk = rotate_reference(qd, z_per_query_head, inv_freq), rotate_reference(kd, zd, inv_freq)
    truth = torch.autograd.grad((tq * gq.double()).sum() + (tk * gk.double()).sum(), (qd, kd, zd))
    roundings = rotation_roundings(z, inv_freq.float())
    assert_within(rq, tq, roundings=roundings, magnitude=rotation_magnitude(q), what="rotated q")
    assert_within(rk, tk, roundings=roundings, magnitude=rotation_magnitude(k), what="rotated k")
    for got, want, g, what in ((grads[0], truth[0], gq, "dL/dq"), (grads[1], truth[1], gk, "dL/dk")):
        assert_within(got, want, roundings=roundings, magnitude=rotation_magnitude(g), what=what)
    # dL/dz: per position, (group + 1) heads x HD/2 pairs of products, each within the rotation's error.
    terms = (H // n_kv + 1) * HD
    magnitude = (gq.abs().amax() * q.abs().amax() + gk.abs().amax() * k.abs().amax()) * inv_freq.sum()
    assert_within(grads[2], truth[2], roundings=roundings + terms, magnitude=magnitude, what="dL/dz")


def test_multi_head_rotation_is_the_plain_rotate_qk_bit_for_bit():
    """With one query head per key/value head the grouped path is today's RePo: the same bits as `rotate_qk`
    on [B, H, T] positions, with and without autograd."""
    B, H, T = 2, 4, 9
    layer = _spread(Layer(n_kv=H))
    x, q, k = torch.randn(B, T, D), torch.randn(B, H, T, HD), torch.randn(B, H, T, HD)
    z = layer.predict_positions(x)
    inv_freq = inv_frequencies(HD, THETA)
    want = rotate_qk(q, k, z, inv_freq)
    with torch.no_grad():
        got = layer.apply_positions(q, k, z)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    got = layer.apply_positions(qg, kg, z)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("n_kv", [4, 2])
def test_tokens_first_layout_gives_the_same_bits(n_kv):
    """vLLM's packed layout q [T, H, hd] (tokens_first) rotates exactly as [H, T, hd] does."""
    T, H = 13, 4
    layer = _spread(Layer(n_kv=n_kv))
    x, q, k = torch.randn(T, D), torch.randn(T, H, HD), torch.randn(T, n_kv, HD)
    with torch.no_grad():
        packed = layer.reposition(x, q, k, tokens_first=True)
        heads_first = layer.reposition(x, q.transpose(0, 1), k.transpose(0, 1))
    assert packed[0].shape == (T, H, HD) and packed[1].shape == (T, n_kv, HD)
    for got, want in zip(packed, heads_first):
        assert torch.equal(got, want.transpose(0, 1))


def test_attention_factor_and_scaled_frequencies_come_from_rope_frequencies():
    """A backend with scaled RoPE (YaRN) overrides `rope_frequencies`: the rotation uses its frequencies and
    multiplies q and k by its attention factor, as its RoPE layers do."""

    class Scaled(Layer):
        def rope_frequencies(self, device):
            return inv_frequencies(HD, THETA, device) / 4, 1.25

    B, H, T = 1, 4, 6
    layer, plain = _spread(Scaled()), _spread(Layer())
    x, q, k = torch.randn(B, T, D), torch.randn(B, H, T, HD), torch.randn(B, H, T, HD)
    with torch.no_grad():
        z = layer.predict_positions(x)
        got = layer.apply_positions(q, k, z)
    want = rotate_qk(q, k, z, inv_frequencies(HD, THETA) / 4)
    assert all(torch.equal(g, 1.25 * w) for g, w in zip(got, want))
    with torch.no_grad():
        unscaled = plain.apply_positions(q, k, z)
    assert not torch.equal(unscaled[0], want[0])  # the frequencies were the override's


def test_nope_layers_rotate_nothing():
    layer = Layer("nope")
    q, k = torch.randn(1, 4, 3, HD), torch.randn(1, 4, 3, HD)
    out = layer.reposition(torch.randn(1, 3, D), q, k)
    assert out[0] is q and out[1] is k


def test_the_hook_observes_what_the_layer_rotates_by_and_is_removed_after():
    model = nn.ModuleList([Layer(layer_id=3), Layer("nope", layer_id=4), Layer(layer_id=7, n_kv=2)])
    for layer in model:
        if layer.pe_mode == PositionMode.repo:
            _spread(layer, seed=layer.layer_id)
    assert repo_layers(model) == [model[0], model[2]]
    x = torch.randn(2, 5, D)
    seen = []
    with observe_positions(model, lambda i, z: seen.append(i)), record_positions(model) as positions:
        computed = {layer.layer_id: layer.predict_positions(x) for layer in model if layer.pe_mode == "repo"}
        computed[3] = model[0].predict_positions(x)  # a second call (a recomputation) is observed too
    assert seen == [3, 7, 3]
    assert positions.keys() == {3, 7} and all(torch.equal(positions[i], computed[i]) for i in (3, 7))
    assert positions[7].shape == (2, 2, 5)
    model[0].predict_positions(x)
    assert seen == [3, 7, 3] and not any(m.positions_out._forward_hooks for m in repo_layers(model))


def test_load_f_phi_takes_this_ranks_rows_of_final_map():
    full = _spread(Layer(n_kv=4))
    shard = Layer(n_kv=4, kv_heads=range(2, 4))
    assert shard.final_map.weight.shape == (2, D // F_PHI_HIDDEN_RATIO)
    for param, loaded in zip(shard.f_phi_weights(), full.f_phi_weights()):
        shard.load_f_phi(param, loaded)
    assert all(torch.equal(s, f) for s, f in zip(shard.f_phi_weights()[:2], full.f_phi_weights()[:2]))
    assert torch.equal(shard.final_map.weight, full.final_map.weight[2:4])
    x = torch.randn(3, D)
    z, z_full = shard.predict_positions(x), full.predict_positions(x)  # [2, 3], [4, 3]
    assert torch.equal(z, f_phi(x, *shard.f_phi_weights()))
    # final_map's GEMM with fewer output rows may sum its d/8 terms in another order: each result is within
    # d/8 roundings of sum_j |h_j| |w_j| (h: the product before final_map, the same bits in both).
    gate, content, final = (w.double() for w in full.f_phi_weights())
    h = torch.nn.functional.silu(x.double() @ gate.T) * (x.double() @ content.T)
    magnitude = (h.abs() @ final.abs().T).T[2:4]
    assert_within(z, z_full[2:4].double(), roundings=2 * (D // F_PHI_HIDDEN_RATIO), magnitude=magnitude)


def test_a_final_map_of_another_size_is_refused_in_one_line_naming_the_key():
    """A multi-head checkpoint (one position per query head) into a grouped layer, by `load_state_dict` and
    by vLLM's loader (`load_f_phi`)."""
    mha, gqa = _spread(Layer(n_kv=4)), Layer(n_kv=2)
    wrapped = nn.ModuleDict({"attn": gqa})
    with pytest.raises(
        ValueError,
        match=r"^attn\.final_map\.weight predicts 4 positions per token, but this model has 2 key/value heads",
    ) as error:
        wrapped.load_state_dict({f"attn.{k}": v for k, v in mha.state_dict().items()})
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="predicts 4 positions per token, but this model has 2"):
        gqa.load_f_phi(gqa.final_map.weight, mha.final_map.weight)
    gqa.load_state_dict(_spread(Layer(n_kv=2)).state_dict())  # the right size loads


def _saved_and_grads(layer: Layer, reader: nn.Linear, x: torch.Tensor, share: bool):
    """Under bf16 autocast: f_phi's positions and a reader of x (the owner's projection), the storages autograd
    keeps (weights aside) and the gradients of x and every weight, with `shared_cast` or with autocast's casts."""
    weights = [reader.weight, *layer.f_phi_weights()]
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if all(t.untyped_storage().data_ptr() != w.untyped_storage().data_ptr() for w in weights):
            kept.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        if share:
            with layer.shared_cast(x, reader) as x_in:
                z, y = layer.predict_positions(x_in), reader(x)
        else:
            z, y = layer.predict_positions(x), reader(x)
    gen = torch.Generator().manual_seed(1)
    loss = (z * torch.randn(z.shape, generator=gen)).sum() + (
        y.float() * torch.randn(y.shape, generator=gen)
    ).sum()
    return list(kept.values()), torch.autograd.grad(loss, [x, *weights])


def test_shared_cast_keeps_one_bf16_x_for_f_phi_and_the_owners_projection_with_autocasts_gradients():
    """Under autocast f_phi's activation checkpoint and the owner's projection of x keep one bf16 copy of x, not
    one each; the gradients are autocast's own casts', bit for bit."""
    layer, reader = _spread(Layer()), nn.Linear(D, 3 * D, bias=False)
    x = torch.randn(2, 7, D, requires_grad=True)
    (kept, want), (shared, got) = (_saved_and_grads(layer, reader, x, share) for share in (False, True))
    copies = lambda ts: [t for t in ts if t.numel() == x.numel() and t.dtype == torch.bfloat16]  # noqa: E731
    assert len(copies(kept)) == 2 and len(copies(shared)) == 1
    assert torch.equal(copies(shared)[0].view(x.shape), x.detach().bfloat16())
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with layer.shared_cast(x, reader) as x_in:  # no autocast: x itself, nothing hooked
        assert x_in is x and not reader._forward_pre_hooks
