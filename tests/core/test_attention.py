"""RePo / NoPE / RoPE per layer as an OLMo-core attention variant (`olmo_repo.olmocore.attention`)."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.attention import Attention, SlidingWindowAttentionConfig
from olmo_core.nn.attention.base import SequenceMixerConfig
from olmo_core.nn.rope import RoPEConfig, YaRNRoPEScalingConfig
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig, OptimGroupOverride

from olmo_repo.modes import F_PHI_WEIGHTS, layer_modes
from olmo_repo.olmocore.attention import RepoAttention, RepoAttentionConfig, with_position_modes
from olmo_repo.rope import RepoLayer, record_positions, set_index_blend

from .tiny import assert_within, olmo2_tiny


def _model(config: TransformerConfig, seed: int = 0, spread: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=64)
    if spread:  # OLMo's init predicts positions ~1e-4: widen them so that the rotation matters
        with torch.no_grad():
            for block in model.blocks.values():
                if isinstance(block.attention, RepoAttention) and block.attention.pe_mode == "repo":
                    block.attention.final_map.weight.mul_(spread)
    return model.eval()


@pytest.mark.parametrize(
    "mode, start, ids",
    [("repo", 1, None), ("nope", 0, None), ("repo", 0, [0, 2]), ("nope", 2, [0, 1, 2, 3]), ("rope", 0, None)],
)
def test_layers_take_the_modes_rule(mode, start, ids):
    """Each layer is what `olmo_repo.modes` selects: OLMo-core's own Attention with RoPE for `rope`, a
    RepoAttention without RoPE module for `nope`/`repo`, f_phi's weights (and only those) in `repo` layers."""
    config = olmo2_tiny(mode, start, ids)
    model = config.build(init_device="meta")
    expected = layer_modes(SimpleNamespace(pe_mode=mode, pe_start_layer=start, pe_layer_ids=ids), n_layers=4)
    assert config.block.sequence_mixer.layer_modes(4) == expected
    stock = set(olmo2_tiny("rope").build(init_device="meta").state_dict())
    for i, block in model.blocks.items():
        att, want = block.attention, expected[int(i)]
        assert (type(att) is Attention) == (want == "rope")
        assert (att.rope is not None) == (want == "rope")
        names = {k for k in model.state_dict() if k.startswith(f"blocks.{i}.")}
        f_phi = {f"blocks.{i}.attention.{n}.weight" for n in F_PHI_WEIGHTS}
        assert names - stock == (f_phi if want == "repo" else set())


@pytest.mark.parametrize(
    "options",
    [
        dict(qk_norm=True),  # OLMo 2: full-width q/k norm, MHA
        dict(n_kv_heads=2, use_head_qk_norm=True, head_dim=48),  # Qwen 3: per-head norm, head width != d / H
        dict(
            sliding_window=SlidingWindowAttentionConfig(
                pattern=[16, -1], force_full_attention_on_last_layer=True
            )
        ),
        dict(n_kv_heads=1, bias=True, clip_qkv=8.0, dropout=0.0, attention_sinks=True),
    ],
)
def test_a_repo_or_nope_layer_is_what_olmo_cores_build_makes_without_rope(options):
    """`RepoAttention` is constructed with the arguments OLMo-core's `AttentionConfig.build` gives its own
    `Attention` (restated in `olmo_repo.upstream.olmo_core.attention_kwargs`): every attribute and every tensor
    of a stock layer built without RoPE, in each layer (windows differ by layer), plus the RePo core's."""
    from olmo_core.nn.attention import AttentionConfig
    from olmo_core.nn.layer_norm import LayerNormConfig

    if options.pop("qk_norm", False) or options.get("use_head_qk_norm"):
        options["qk_norm"] = LayerNormConfig(name="rms", eps=1e-6)
    stock = AttentionConfig(n_heads=4, rope=RoPEConfig(theta=10_000), **options)
    repo = RepoAttentionConfig(**{**stock.as_dict(recurse=False), "pe_mode": "nope"})
    for layer in range(3):
        torch.manual_seed(layer)
        a = dataclasses.replace(stock, rope=None).build(128, layer_idx=layer, n_layers=3, init_device="cpu")
        torch.manual_seed(layer)
        b = repo.build(128, layer_idx=layer, n_layers=3, init_device="cpu")
        assert type(b) is RepoAttention and b.pe_mode == "nope"
        core = (*RepoLayer.__annotations__, "repo_rope")  # what init_repo sets, and the RoPE config
        ours = {k: repr(v) for k, v in vars(b).items() if k not in (*core, "_modules", "_parameters")}
        assert ours == {k: repr(v) for k, v in vars(a).items() if k not in ("_modules", "_parameters")}, layer
        assert {k: repr(v) for k, v in b.named_children()} == {k: repr(v) for k, v in a.named_children()}
        theirs = a.state_dict()
        assert {k: (v.shape, v.dtype) for k, v in b.state_dict().items()} == {
            k: (v.shape, v.dtype) for k, v in theirs.items()
        }
        for key, value in b.state_dict().items():  # `sinks` is torch.empty until init_weights
            assert key == "sinks" or torch.equal(value, theirs[key]), key


def test_config_round_trips_and_is_registered():
    config = olmo2_tiny("repo", 1, [1, 3])
    assert SequenceMixerConfig.get_registered_class("repo") is RepoAttentionConfig
    saved = config.as_config_dict()
    assert saved["block"]["sequence_mixer"]["_CLASS_"] == "olmo_repo.olmocore.attention.RepoAttentionConfig"
    assert TransformerConfig.from_dict(saved) == config


def test_presets_get_position_modes():
    """OLMo-core's presets: OLMo 2 1B with RePo from layer 5 (the paper's), OLMo 3 7B with its sliding windows
    kept layer by layer."""
    one_b = with_position_modes(TransformerConfig.olmo2_1B_v2(vocab_size=100352), "repo", pe_start_layer=5)
    model = one_b.build(init_device="meta")
    assert [i for i, b in model.blocks.items() if isinstance(b.attention, RepoAttention)] == [
        str(i) for i in range(5, 16)
    ]
    stock7 = TransformerConfig.olmo3_7B(vocab_size=100352).build(init_device="meta")
    repo7 = with_position_modes(
        TransformerConfig.olmo3_7B(vocab_size=100352), "repo", pe_start_layer=10
    ).build(init_device="meta")
    assert [b.attention.window_size for b in repo7.blocks.values()] == [
        b.attention.window_size for b in stock7.blocks.values()
    ]
    assert sum(isinstance(b.attention, RepoAttention) for b in repo7.blocks.values()) == 22


def test_olmo3_32b_gets_one_position_per_kv_head():
    config32 = TransformerConfig.olmo3_32B(vocab_size=100352)
    att = config32.block.sequence_mixer
    assert (att.n_heads, att.n_kv_heads) == (40, 8)
    repo32 = with_position_modes(config32, "repo", pe_start_layer=22).build(init_device="meta")
    assert repo32.blocks["22"].attention.final_map.weight.shape == (8, 5120 // 8)


def test_flops_count_f_phi_like_any_projection():
    """OLMo-core's FLOP count (6 per parameter of the module, plus attention) includes f_phi exactly."""
    rope, repo = olmo2_tiny("rope").build(init_device="meta"), olmo2_tiny("repo", 1).build(init_device="meta")
    f_phi = sum(p.numel() for n, p in repo.named_parameters() if n.split(".")[-2] in F_PHI_WEIGHTS)
    assert f_phi == 3 * (2 * 64 * 8 + 8 * 4)
    assert repo.num_flops_per_token(32) - rope.num_flops_per_token(32) == 6 * f_phi


def test_init_and_weight_decay_like_any_projection():
    model = _model(olmo2_tiny("repo", 1))
    att = model.blocks["1"].attention
    for name in F_PHI_WEIGHTS:
        w = getattr(att, name).weight
        assert 0 < w.abs().max() <= 3 * 0.02 and 0.01 < w.std() < 0.03, name  # truncated normal, std 0.02
    optim = AdamWConfig(
        lr=1e-3,
        weight_decay=0.1,
        group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
    ).build(model)
    decay = {id(p): g["weight_decay"] for g in optim.param_groups for p in g["params"]}
    assert decay[id(att.gate_map.weight)] == decay[id(att.w_q.weight)] == 0.1
    assert {decay[id(getattr(att, n).weight)] for n in F_PHI_WEIGHTS} == {0.1}


def test_repo_rotation_at_integer_positions_is_olmo_cores_rope():
    """apply_positions with positions 0..T-1 is OLMo-core's RotaryEmbedding (fp32, both rotate at fp32)."""
    att = _model(olmo2_tiny("repo", 1)).blocks["1"].attention
    rope = RoPEConfig(theta=500_000).build(att.head_dim)
    q, k = torch.randn(2, 16, 4, 16), torch.randn(2, 16, 4, 16)  # [B, T, H, hd]
    positions = torch.arange(16.0).expand(2, 4, 16)  # [B, H_kv, T]
    got = att.apply_positions(q, k, positions, tokens_first=True)
    want = rope(q, k, head_first=False)
    for g, w, what in zip(got, want, "qk"):
        assert_within(g, w, roundings=16 * 4, what=what)  # angle and sin/cos of up to 15 rad, products


def _reference(att: Attention, x: torch.Tensor, mode: str, window: int | None = None) -> torch.Tensor:
    """The attention of a RePo/NoPE layer in float64 by hand: projections, full-width q/k RMS norms, f_phi,
    the rotation from cos/sin, keys and values expanded to the query heads, a causal (windowed) softmax."""
    x = x.double()
    B, T, _ = x.shape
    H, Hkv, hd = att.n_heads, att.n_kv_heads, att.head_dim
    W = lambda m: m.weight.double()  # noqa: E731
    rms = lambda t, n: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + n.eps) * n.weight.double()  # noqa: E731
    q = rms(x @ W(att.w_q).T, att.q_norm).view(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd]
    k = rms(x @ W(att.w_k).T, att.k_norm).view(B, T, Hkv, hd).transpose(1, 2)
    v = (x @ W(att.w_v).T).view(B, T, Hkv, hd).transpose(1, 2)
    if mode == "repo":
        z = (F.silu(x @ W(att.gate_map).T) * (x @ W(att.content_map).T)) @ W(att.final_map).T  # [B, T, Hkv]
        inv = 1.0 / (500_000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        angles = z.transpose(1, 2)[..., None] * inv  # [B, Hkv, T, hd/2]

        def rot(t, a):
            t1, t2 = t.chunk(2, -1)
            return torch.cat((t1 * a.cos() - t2 * a.sin(), t2 * a.cos() + t1 * a.sin()), -1)

        k = rot(k, angles)
        q = rot(q, angles.repeat_interleave(H // Hkv, dim=1))
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((j > i - window) if window else True)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~allowed, -math.inf)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
    return out @ W(att.w_out).T


@pytest.mark.parametrize(
    "mode, kv_heads, window",
    [
        ("repo", None, None),
        ("nope", None, None),
        ("repo", None, 6),
        ("repo", 2, None),
        ("repo", 1, 6),
    ],
)
def test_attention_matches_float64_truth(mode, kv_heads, window):
    """A RePo/NoPE layer in fp32 (torch SDPA, OLMo-core's CPU backend) against the float64 formula; grouped
    keys (2 and 1 KV heads: GQA, MQA) expanded by hand there; sliding windows as OLMo 3 sets them."""
    sliding = (
        SlidingWindowAttentionConfig(
            pattern=[window],
            force_full_attention_on_first_layer=False,
            force_full_attention_on_last_layer=False,
        )
        if window
        else None
    )
    config = olmo2_tiny(mode, 1, n_kv_heads=kv_heads, sliding_window=sliding)
    att = _model(config, spread=3000.0).blocks["1"].attention
    assert att.window_size == window
    x = torch.randn(2, 24, 64)
    with record_positions(att) as positions:
        got = att(x)
    if mode == "repo":
        assert positions[1].shape == (2, kv_heads or 4, 24) and positions[1].abs().max() > 1.0
    # roundings: d (projections, norms, f_phi's inputs), d/8 (final_map), angles and sin/cos, hd, T, d (w_out)
    assert_within(got, _reference(att, x, mode, window), roundings=4 * 64 + 8 + 64 + 16 + 24 + 64)


def test_yarn_scales_repo_frequencies_as_olmo_core_scales_rope():
    """A RoPE scaling config (YaRN here) gives RePo layers OLMo-core's scaled frequencies and attention factor."""
    yarn = YaRNRoPEScalingConfig(factor=4.0, old_context_len=32)
    config = olmo2_tiny("repo", 1, rope_scaling=yarn)
    att = _model(config).blocks["1"].attention
    inv_freq, factor = att.rope_frequencies(torch.device("cpu"))
    want, want_factor = yarn.compute_scaled_inv_freq(theta=500_000, dim=16, device=torch.device("cpu"))
    assert torch.equal(inv_freq, want) and factor == want_factor != 1.0


def test_document_masking_and_context_shards_need_no_positions():
    """A token's rotation depends on its own hidden state only: q and k of a RePo layer for packed documents
    (with `cu_doc_lens`, as document masking passes them) or for a context-parallel shard of the sequence are
    the rows of the full forward's, with no position offset to exchange (RoPE layers need one for both)."""
    model = _model(olmo2_tiny("repo", 1), spread=300.0)
    repo, rope = model.blocks["1"].attention, model.blocks["0"].attention
    x = torch.randn(1, 20, 64)
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    q, k, _ = repo._prepare_qkv(x)
    q_doc, k_doc, _ = repo._prepare_qkv(x, cu_doc_lens=cu)
    q_shard, k_shard, _ = repo._prepare_qkv(x[:, 8:])
    assert torch.equal(q_doc, q) and torch.equal(k_doc, k)
    torch.testing.assert_close(q_shard, q[:, 8:], rtol=0, atol=0)
    torch.testing.assert_close(k_shard, k[:, 8:], rtol=0, atol=0)
    q_rope, _, _ = rope._prepare_qkv(x)
    q_rope_doc, _, _ = rope._prepare_qkv(x, cu_doc_lens=cu)
    assert not torch.allclose(q_rope[:, 8:], q_rope_doc[:, 8:])  # RoPE restarts positions per document


def test_configs_that_cannot_work_fail_naming_the_key():
    with pytest.raises(OLMoConfigurationError, match=r"model.block.sequence_mixer.pe_start_layer=9"):
        olmo2_tiny("repo", 9)
    with pytest.raises(OLMoConfigurationError, match=r"pe_mode='rotary'"):
        olmo2_tiny("rotary", 1)
    with pytest.raises(OLMoConfigurationError, match=r"n_kv_heads=3"):
        olmo2_tiny("repo", 1, n_kv_heads=3)  # 4 query heads do not group into 3
    with pytest.raises(OLMoConfigurationError, match=r"name=fused_v2"):
        with_position_modes(
            TransformerConfig.llama_like(vocab_size=100, d_model=64, n_layers=2, n_heads=4, fused_ops=True),
            "repo",
        )
    with pytest.raises(OLMoConfigurationError, match=r"unexpected keyword argument 'pe_start_layr'"):
        with_position_modes(olmo2_tiny("rope"), "repo", pe_start_layr=1)  # the keys are PositionKeys' fields


# ------------------------------------------------------------------------------------------- the index blend


def _blend_models(spread: float = 300.0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The RoPE model and the RePo model made from it (RePo in layers 1-3, every stock weight copied, f_phi at
    its init widened so that its positions are far from the index: a trained, non-zero f_phi)."""
    rope = _model(olmo2_tiny("rope"))
    repo = _model(
        with_position_modes(
            olmo2_tiny("rope"), "repo", pe_start_layer=1, pe_blend_init=1.0, pe_blend_steps=4
        ),
        spread=spread,
    )
    assert set(repo.load_state_dict(rope.state_dict(), strict=False).missing_keys) == {
        f"blocks.{i}.attention.{n}.weight" for i in (1, 2, 3) for n in F_PHI_WEIGHTS
    }
    return rope, repo


def test_blend_keys_are_the_rule_sets_and_override_like_any_key():
    """`RepoAttentionConfig` takes its position keys from `modes.PositionKeys` (the one declaration), defaults the
    paper's (no blend); `--model.block.sequence_mixer.pe_blend_init=...` reaches them, and the config records them."""
    from olmo_repo.modes import PE_KEYS

    config = olmo2_tiny("repo", 1)
    att = config.block.sequence_mixer
    assert {f.name for f in dataclasses.fields(RepoAttentionConfig)} >= set(PE_KEYS)
    assert (att.pe_blend_init, att.pe_blend_steps) == (0.0, 0)
    merged = config.merge(
        ["block.sequence_mixer.pe_blend_init=0.5", "block.sequence_mixer.pe_blend_steps=100"]
    )
    saved = merged.as_config_dict()["block"]["sequence_mixer"]
    assert (saved["pe_blend_init"], saved["pe_blend_steps"]) == (0.5, 100)
    assert TransformerConfig.from_dict(merged.as_config_dict()) == merged


@pytest.mark.parametrize(
    "keys, says",
    [
        (
            dict(pe_blend_init=1.5, pe_blend_steps=10),
            "model.block.sequence_mixer.pe_blend_init=1.5 is not a blend",
        ),
        (dict(pe_blend_init=-0.1, pe_blend_steps=10), "pe_blend_init=-0.1 is not a blend weight"),
        (
            dict(pe_blend_init=1.0, pe_blend_steps=-1),
            "model.block.sequence_mixer.pe_blend_steps=-1 is not a step",
        ),
        (dict(pe_mode="nope", pe_blend_init=1.0, pe_blend_steps=10), "but this model has none"),
    ],
)
def test_bad_blend_values_are_refused_naming_the_key(keys, says):
    mode = keys.pop("pe_mode", "repo")
    with pytest.raises(OLMoConfigurationError, match=re.escape(says)) as error:
        with_position_modes(olmo2_tiny("rope"), mode, pe_start_layer=1, **keys)
    assert "\n" not in str(error.value)


def test_blend_at_one_is_the_rope_model_bitwise():
    """p = 1: each RePo layer rotates by exactly the token index, as the RoPE layer it replaced, so the logits
    are the RoPE model's bit for bit in fp32 (f_phi far from the index). OLMo-core's RoPE computes the same fp32
    numbers: inverse frequencies theta^(-2k/d), angles index x frequency (one product each), cos/sin, and
    x1 cos - x2 sin, x2 cos + x1 sin (its t cos + rotate_half(t) sin: the same products and sums)."""
    rope, repo = _blend_models()
    ids = torch.randint(0, 100, (2, 40))
    with torch.no_grad():
        want = rope(ids)
        set_index_blend(repo, 1.0)
        got = repo(ids)
        set_index_blend(repo, 0.0)
        learned = repo(ids)
    assert torch.equal(got, want)
    assert (learned - want).abs().max() > 1e-2  # f_phi's own positions score otherwise


def _unrotated(att: RepoAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _ = Attention._prepare_qkv(
        att, x
    )  # OLMo-core's step without RoPE (the layer has none): [B, T, H, hd]
    return q, k


@pytest.mark.parametrize("offset", ["start_pos", "documents"])
def test_half_blend_rotates_by_the_hand_computed_positions_at_the_tokens_index(offset):
    """p = 0.5, a trained f_phi, tokens whose index is not 0..T-1: decoding after a KV cache's 7 tokens
    (`start_pos`, as OLMo-core's KV cache passes it), or the second of two packed documents (`cu_doc_lens`:
    OLMo-core's RoPE restarts there). q and k are rotated by 0.5 z + 0.5 i with i that index, and differ from
    p = 0 (f_phi alone) and p = 1 (the RoPE layer's rotation, checked against OLMo-core's RoPE at that offset)."""
    rope, repo = _blend_models()
    att, stock = repo.blocks["1"].attention, rope.blocks["1"].attention
    x = torch.randn(2, 12, 64)
    if offset == "start_pos":
        kwargs, index = dict(start_pos=torch.tensor(7, dtype=torch.int32)), 7 + torch.arange(12.0)
    else:
        cu = torch.tensor([0, 5, 12, 24], dtype=torch.int32)  # row 0: 5 + 7 tokens; row 1: one document
        kwargs, index = (
            dict(cu_doc_lens=cu),
            torch.cat((torch.arange(5.0), torch.arange(7.0), torch.arange(12.0))),
        )
        index = index.view(2, 12)
    q0, k0 = _unrotated(att, x)
    z = att.predict_positions(x)  # [B, H_kv, T], far from the index
    results = {}
    for p in (0.0, 0.5, 1.0):
        set_index_blend(repo, p)
        results[p] = att._prepare_qkv(x, **kwargs)[:2]
    blended = 0.5 * z + 0.5 * torch.broadcast_to(index, (2, 12)).unsqueeze(1)  # by hand: (1 - p) z + p i
    want = att.apply_positions(q0, k0, blended, tokens_first=True)
    for got, w in zip(results[0.5], want):
        assert torch.equal(got, w)
    assert not torch.allclose(results[0.5][0], results[0.0][0], atol=1e-3)
    assert not torch.allclose(results[0.5][0], results[1.0][0], atol=1e-3)
    for got, w in zip(results[1.0], stock._prepare_qkv(x, **kwargs)[:2]):
        assert torch.equal(got, w)  # p = 1: OLMo-core's RoPE at the same offset


def test_a_context_parallel_blend_is_refused_before_the_run(tmp_path):
    """A context-parallel shard of a RePo layer has no token index (OLMo-core shards RoPE's tables only): a
    blend there is refused in one line by the launcher's check, not guessed."""
    from olmo_core.train.train_module import TransformerContextParallelConfig

    from olmo_repo.olmocore.checks import check_experiment

    from .training import tiny_experiment

    blend = [
        "--model.block.sequence_mixer.pe_blend_init=1.0",
        "--model.block.sequence_mixer.pe_blend_steps=10",
    ]
    config = tiny_experiment(tmp_path / "run", tmp_path, *blend)
    config.train_module.cp_config = TransformerContextParallelConfig.llama3(degree=2)
    with pytest.raises(OLMoConfigurationError, match=r"pe_blend_init=1.0 .* unset train_module.cp_config"):
        check_experiment(config, world_size=2)
    assert not (tmp_path / "run").exists()
