"""The index blend and the replaced positions on the Hugging Face side (issue 48), every family: at p = 1 a RePo
model scores as the RoPE model it was made from (bitwise in fp32 with unscaled RoPE; within float64 bounds with
YaRN, whose attention factor the two apply in different places), `pe_positions: constant` as the NoPE model,
and at p = 0.5 with trained (non-zero) f_phi a KV-cache decode step at a non-zero offset equals the full
forward, which differs from p = 0 and p = 1: a model that ignored p, or the index's offset, fails here."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import olmo_repo.hf  # noqa: F401  (registers the RePo configs with the Auto classes)
from olmo_repo.hf import (
    RepoLlamaConfig,
    RepoLlamaForCausalLM,
    RepoOlmo2Config,
    RepoOlmo2ForCausalLM,
    RepoOlmo3Config,
    RepoOlmo3ForCausalLM,
    RepoQwen3Config,
    RepoQwen3ForCausalLM,
)
from olmo_repo.modes import F_PHI_WEIGHTS

from .bounds import assert_within

FAMILIES = {  # family -> (stock config, stock causal LM, RePo config, RePo causal LM)
    "olmo2": (Olmo2Config, Olmo2ForCausalLM, RepoOlmo2Config, RepoOlmo2ForCausalLM),
    "olmo3": (Olmo3Config, Olmo3ForCausalLM, RepoOlmo3Config, RepoOlmo3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM, RepoLlamaConfig, RepoLlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, RepoQwen3Config, RepoQwen3ForCausalLM),
}
VOCAB, T = 96, 12
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    initializer_range=0.125,
    pad_token_id=0,
)
EXTRA = {"olmo3": dict(sliding_window=5)}  # OLMo 3's sliding-window layers with RePo in them
REPO = dict(pe_mode="repo", pe_start_layer=1)
YARN = dict(rope_type="yarn", rope_theta=10_000.0, factor=4.0, original_max_position_embeddings=16)


def _config(family: str, which: int, **overrides):
    return FAMILIES[family][which](**{**BASE, **EXTRA.get(family, {}), **overrides})


def _stock(family: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = FAMILIES[family][1](_config(family, 0, **overrides)).eval()
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):  # around 1, not 1: a q/k norm would commute with the rotation
            torch.nn.init.uniform_(param, 0.5, 1.5)
    return model


def _repo(stock: torch.nn.Module, family: str, **keys) -> torch.nn.Module:
    """`stock`'s weights in a RePo model whose f_phi is trained-looking (positions in the tens)."""
    config = _config(family, 2, **{**stock.config.to_diff_dict(), "model_type": None, **keys})
    model = FAMILIES[family][3](config).eval().to(next(stock.parameters()).dtype)
    missing, unexpected = model.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and all(key.split(".")[-2] in F_PHI_WEIGHTS for key in missing)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key in missing:
            param = model.get_parameter(key)
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.5)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_at_p_one_repo_scores_as_the_rope_model_it_was_made_from_bitwise(family):
    stock = _stock(family)
    ids = torch.randint(1, VOCAB, (2, T))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row: the index is the stock RoPE's position_ids, not the column
    with torch.no_grad():
        want = stock(ids, attention_mask=mask).logits
        for keys in (dict(pe_blend=1.0), dict(pe_positions="index")):
            assert torch.equal(_repo(stock, family, **REPO, **keys)(ids, attention_mask=mask).logits, want), (
                keys
            )
        learned = _repo(stock, family, **REPO)(ids, attention_mask=mask).logits
    assert not torch.allclose(learned, want)  # f_phi's positions are far from the index


@pytest.mark.parametrize("family", ["olmo2", "llama"])
def test_constant_positions_score_as_the_nope_model(family):
    stock = _stock(family)
    ids = torch.randint(1, VOCAB, (2, T))
    with torch.no_grad():
        nope = _repo(stock, family, pe_mode="nope", pe_start_layer=1)(ids).logits
        constant = _repo(stock, family, **REPO, pe_positions="constant")(ids).logits
    assert torch.equal(constant, nope)


def test_at_p_one_with_yarn_repo_scores_as_rope_within_fp32_bounds():
    """YaRN's attention factor: stock RoPE scales cos and sin, a RePo layer the rotated q and k (the same number,
    rounded in other places), so the two agree to roundings: counted as tests/test_hf_families.py counts them
    (per layer its reduction lengths plus the rotation's, in eps x max|logit|), twice (two fp32 results)."""
    stock = _stock("llama", rope_parameters=YARN)
    ids = torch.randint(1, VOCAB, (2, 40))  # past the original 16 positions
    with torch.no_grad():
        want = stock(ids).logits
        got = _repo(stock, "llama", **REPO, pe_blend=1.0)(ids).logits
    c, n = stock.config, ids.shape[1]
    inv_freq = stock.model.rotary_emb.inv_freq
    rotation = (n - 1) * inv_freq.max().item() + 7  # the angle, cos/sin, the pair and the factor
    layer = 8 * c.hidden_size + 2 * c.head_dim + n + c.num_attention_heads * c.head_dim
    roundings = 2 * (c.num_hidden_layers * (layer + c.intermediate_size + rotation) + 2 * c.hidden_size)
    assert_within(got, want, roundings=roundings, what="RePo at p = 1 against YaRN RoPE")


@pytest.mark.parametrize("family", FAMILIES)
def test_at_p_half_a_cached_decode_step_at_an_offset_equals_the_full_forward(family):
    stock = _stock(family).double()  # float64: the cached and full attentions sum in other orders
    ids = torch.randint(1, VOCAB, (2, T))
    with torch.no_grad():
        model = _repo(stock, family, **REPO, pe_blend=0.5)
        full = model(ids).logits
        out = model(ids[:, :-1], use_cache=True)  # the decode step's token is at index T - 1
        step = model(ids[:, -1:], cache=out.cache, use_cache=True).logits[:, -1]
        others = [_repo(stock, family, **REPO, pe_blend=p)(ids).logits[:, -1] for p in (0.0, 1.0)]
    c = model.config
    roundings = 8 * (c.hidden_size + c.intermediate_size + T) * c.num_hidden_layers
    assert_within(step, full[:, -1], roundings=roundings, what=f"{family}: cached step at p = 0.5")
    scale = full[:, -1].abs().max()
    for other in others:  # p matters at this size: far beyond the rounding bound
        assert (other - full[:, -1]).abs().max() > 1e-3 * scale


def test_the_keys_survive_save_and_load_and_a_reference_schedule_scores_at_p_zero(tmp_path):
    stock = _stock("olmo2")
    model = _repo(stock, "olmo2", **REPO, pe_blend=0.25, pe_blend_init=1.0, pe_blend_steps=40)
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert (loaded.config.pe_blend, loaded.config.pe_blend_init, loaded.config.pe_blend_steps) == (
        0.25,
        1.0,
        40,
    )
    assert {layer.self_attn.index_blend for layer in loaded.model.layers[1:]} == {0.25}
    ablated = AutoModelForCausalLM.from_pretrained(tmp_path, pe_positions="constant")
    assert {str(layer.self_attn.position_source) for layer in ablated.model.layers[1:]} == {"constant"}
    with pytest.raises(ValueError, match="pe_blend=1.5 is not a blend weight"):
        AutoModelForCausalLM.from_pretrained(tmp_path, pe_blend=1.5)
