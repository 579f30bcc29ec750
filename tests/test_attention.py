"""Attention mass on needle / query / other tokens: a hand-built attention map with a known answer, then real tiny
HF models (RePo, RoPE, NoPE, a hybrid, stock Olmo2) against transformers' own `output_attentions`."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Olmo2Config,
    Olmo2ForCausalLM,
    PreTrainedTokenizerFast,
)

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2)
from olmo_repo.ai2olmo.hf import convert_to_hf
from olmo_repo.eval.attention import (
    AttentionMass,
    attention_mass,
    attention_mass_table,
    group_mass,
    mean_attention_mass,
    token_groups,
)

from .conftest import EMBEDDING, EOS, PAD, make_checkpoint

# A NIAH-like prompt built by hand: a needle sentence, filler, another filler, the question at the end.
NEEDLE = "One of the special magic numbers for lucky-dove is: 7043913."
QUERY = "What is the special magic number for lucky-dove mentioned in the provided text? The answer is"
PROMPT = f"Grass is green. {NEEDLE} " + "The sky is blue. Grass is green. " * 3 + QUERY


def _spans() -> tuple[tuple[int, int], tuple[int, int]]:
    start = PROMPT.index(NEEDLE)
    return (start, start + len(NEEDLE)), (PROMPT.index(QUERY), len(PROMPT))


def test_group_mass_on_a_hand_built_map():
    # 2 layers x 2 heads x 6 tokens; groups: other, needle, needle, other, query, query.
    groups = torch.tensor([2, 0, 0, 2, 1, 1])
    weights = torch.tensor(
        [
            [[0.1, 0.2, 0.2, 0.1, 0.3, 0.1], [0.3, 0.0, 0.4, 0.1, 0.1, 0.1]],  # head mean .2 .1 .3 .1 .2 .1
            [
                [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
                [0.5, 0.1, 0.1, 0.1, 0.1, 0.1],
            ],  # head mean .25 .05 .05 .05 .05 .55
        ]
    )
    expected = torch.tensor([[0.2, 0.15, 0.15], [0.05, 0.3, 0.15]], dtype=torch.float64)
    mass = group_mass(weights, groups)
    assert mass.dtype == torch.float64
    torch.testing.assert_close(mass, expected, rtol=0, atol=1e-7)  # float32 inputs
    with pytest.raises(ValueError, match="no token in group"):
        group_mass(weights, torch.tensor([2, 0, 0, 2, 0, 0]))
    with pytest.raises(ValueError, match="disagree"):
        group_mass(weights[..., :5], groups)


def test_token_groups_from_character_offsets():
    # Tokens: a special token without characters, "ab", "c", "de" (crosses into the query), "f", "gh".
    offsets = [(0, 0), (0, 2), (2, 3), (3, 5), (5, 6), (6, 8)]
    groups = token_groups(offsets, needle_spans=[(1, 3)], query_span=(4, 6))
    assert groups.tolist() == [2, 0, 0, 1, 1, 2]
    assert token_groups(offsets, [(0, 1), (6, 7)], (3, 4)).tolist() == [2, 0, 2, 1, 2, 0]  # two needles
    with pytest.raises(ValueError, match="covers no token"):
        token_groups(offsets, [(20, 30)], (4, 6))
    with pytest.raises(ValueError, match="overlaps a needle"):
        token_groups(offsets, [(1, 3)], (2, 6))
    with pytest.raises(ValueError, match="not a character span"):
        token_groups(offsets, [(3, 3)], (4, 6))
    with pytest.raises(ValueError, match="no needle"):
        token_groups(offsets, [], (4, 6))


STOCK = "stock-olmo2"
MODELS = {
    "repo": dict(pe_mode="repo", pe_start_layer=1),
    "rope": dict(),
    "nope": dict(pe_mode="nope"),
    "hybrid": dict(pe_mode="repo", pe_layer_ids=[0, 2]),
    "gqa": dict(pe_mode="repo", pe_start_layer=1, n_kv_heads=2),  # attention per query head, as stock
    STOCK: None,
}


@pytest.fixture(params=list(MODELS))
def model_and_tokenizer(request, tmp_path, tokenizer_file):
    if request.param == STOCK:  # a stock transformers Olmo2, saved and loaded as users would
        config = Olmo2Config(
            vocab_size=EMBEDDING,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=256,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )
        Olmo2ForCausalLM(config).save_pretrained(tmp_path / "hf")
        (tmp_path / "hf" / "tokenizer.json").write_text(tokenizer_file.read_text())
        hf_dir = tmp_path / "hf"
    else:
        ckpt, _ = make_checkpoint(
            tmp_path / "olmo", tokenizer_file, max_sequence_length=256, **MODELS[request.param]
        )
        hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    return request.param, AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)


def test_attention_mass_equals_transformers_attentions(model_and_tokenizer):
    name, model, tokenizer = model_and_tokenizer
    assert model.config._attn_implementation == "sdpa" and not model.training
    model.train()  # the measurement runs in eval mode and leaves the model as it found it
    needle, query = _spans()
    mass = attention_mass(model, tokenizer, PROMPT, [needle], query)
    assert model.config._attn_implementation == "sdpa" and model.training
    model.eval()

    # Ground truth, independently: transformers' own recorded attentions (eager), and groups from the fact that
    # the byte-level tokenizer gives one token per character of this ASCII prompt.
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    T = ids.shape[1]
    assert T == len(PROMPT)
    index = torch.arange(T)
    masks = [
        (index >= needle[0]) & (index < needle[1]),
        (index >= query[0]) & (index < query[1]),
        (index < needle[0]) | ((index >= needle[1]) & (index < query[0])),
    ]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions  # L x [1, H, T, T]
    assert len(attentions) == mass.per_layer.shape[0] == model.config.num_hidden_layers
    for layer, weights in enumerate(attentions):
        row = weights[0, :, -1, :].double().mean(0)  # [T]
        expected = torch.stack([row[m].mean() for m in masks])
        torch.testing.assert_close(mass.per_layer[layer], expected, rtol=0, atol=1e-7)
        # A softmax row sums to one: the group means times the group sizes account for all of it.
        total = sum(mass.per_layer[layer, g] * m.sum() for g, m in enumerate(masks))
        assert abs(total - 1) <= 1e-5
    expected_repo = {"repo": (1, 2, 3), "hybrid": (0, 2), "gqa": (1, 2, 3)}.get(name, ())
    assert mass.repo_layers == expected_repo
    if expected_repo:
        want = mass.per_layer[list(expected_repo)].mean(0).tolist()
        assert list(mass.reduce(expected_repo).values()) == pytest.approx(want, rel=1e-12)


@pytest.mark.slow
def test_several_needles_and_tokens_the_tokenizer_adds(tmp_path, tokenizer_file):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, max_sequence_length=256, pe_mode="repo")
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)
    needle, query = _spans()
    first, second = (needle[0], needle[0] + 20), (needle[0] + 20, needle[1])
    split = attention_mass(model, tokenizer, PROMPT, [first, second], query)
    whole = attention_mass(model, tokenizer, PROMPT, [needle], query)
    torch.testing.assert_close(split.per_layer, whole.per_layer, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="covers no token"):
        attention_mass(model, tokenizer, PROMPT, [(len(PROMPT) + 5, len(PROMPT) + 9)], query)

    # A tokenizer that wraps every text in <pad> ... <eos> (tokens without characters): the leading one is
    # context and counts as `other`; the trailing one is not the predicting token, the last text token is.
    base = Tokenizer.from_file(str(tokenizer_file))
    base.post_processor = TemplateProcessing(
        single="<pad> $A <eos>", special_tokens=[("<pad>", PAD), ("<eos>", EOS)]
    )
    wrapping = PreTrainedTokenizerFast(tokenizer_object=base)
    assert wrapping(PROMPT)["input_ids"][0] == PAD and wrapping(PROMPT)["input_ids"][-1] == EOS
    wrapped = attention_mass(model, wrapping, PROMPT, [needle], query)
    ids = torch.tensor([[PAD, *tokenizer(PROMPT)["input_ids"]]])
    groups = torch.cat(
        [torch.tensor([2]), token_groups([(i, i + 1) for i in range(len(PROMPT))], [needle], query)]
    )
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions
    expected = group_mass(torch.stack([a[0, :, -1, :] for a in attentions]), groups)
    torch.testing.assert_close(wrapped.per_layer, expected, rtol=0, atol=1e-7)
    assert (wrapped.per_layer - whole.per_layer).abs().max() > 1e-4  # the extra token is in the context


def test_table_in_the_papers_units_with_shared_repo_layers():
    repo = AttentionMass(
        torch.tensor([[0.01, 0.02, 0.0001], [0.03, 0.01, 0.0002]], dtype=torch.float64), (1,)
    )
    rope = AttentionMass(torch.tensor([[0.02, 0.01, 0.0003], [0.01, 0.02, 0.0001]], dtype=torch.float64), ())
    lines = attention_mass_table({"RePo": repo, "RoPE": rope}).splitlines()
    assert lines[0].startswith("| model | needle (all) | query (all) | other (all) | needle (RePo layers)")
    # x1e-2: all layers averaged, then layer 1 alone; RoPE is reduced over the RePo model's layer 1 as well.
    assert lines[2] == "| RePo | 2.000 | 1.500 | 0.015 | 3.000 | 1.000 | 0.020 | 1 |"
    assert lines[3] == "| RoPE | 1.500 | 1.500 | 0.020 | 1.000 | 2.000 | 0.010 | 1 |"
    alone = attention_mass_table({"RoPE": rope}).splitlines()[2]
    assert alone == "| RoPE | 1.500 | 1.500 | 0.020 |  |  |  |  |"
    averaged = mean_attention_mass([repo, AttentionMass(torch.zeros(2, 3, dtype=torch.float64), (1,))])
    torch.testing.assert_close(averaged.per_layer, repo.per_layer / 2)
    with pytest.raises(ValueError, match="different models"):
        mean_attention_mass([repo, rope])
