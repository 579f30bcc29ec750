"""The real model downstream: SmolLM2-135M-Instruct (tests/real_models.py; a stock `llama` of 30 layers with 9 query
and 3 key/value heads, trained at 8192) through `scripts/eval.py`'s NIAH and the explorer's model, and, as a
`repo_llama` (RePo from layer 9 on, f_phi new), through the attention-mass and position analyses. Short prompts
(NIAH at 512 tokens), the directory built once per session."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from olmo_repo.cli.eval import main as eval_main
from olmo_repo.eval import niah
from olmo_repo.eval.attention import attention_mass, token_groups
from olmo_repo.eval.positions import patterns_by_layer, spans_by_length, text_positions
from olmo_repo.explore.model import BadRequest, ExplorerModel
from olmo_repo.hf import RepoLlamaConfig

from .real_models import smollm2_dir  # noqa: F401  (the session fixture: the directory, built once)

LENGTH = 512


@pytest.mark.slow
def test_eval_niah_finds_the_needle(smollm2_dir, tmp_path):  # noqa: F811
    """Every sample's answer is in the greedy output (score 1). Robust: greedy decoding of fixed fp32 weights (the
    GGUF's sha256 is checked) on seeded prompts, within the training length (no YaRN); the model states the number
    at once in each of the 8 samples of niah_single_1 and niah_single_2 at 512 tokens (seed 42, 4 each) tried, so
    only a real change (positions, tokenizer, the loaded config) moves it."""
    out = tmp_path / "out"
    args = [str(smollm2_dir), "--tasks", "niah_single_1", "--lengths", str(LENGTH), "--samples", "2"]
    assert eval_main([*args, "--batch-size", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["training_length"] == 8192
    assert results["lengths"][str(LENGTH)] == {
        "yarn_factor": None,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    }
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert r["score"] == 1.0 and r["answers"][0] in r["output"], r
    assert results["scores"]["niah_single_1"][str(LENGTH)] == 1.0


def test_explorer_loads_it(smollm2_dir):  # noqa: F811
    """The explorer's model of a stock Llama: one position per key/value head would be shown, but there is no RePo
    layer, which a request is told in one line."""
    explorer = ExplorerModel(smollm2_dir)
    info = explorer.info()
    assert (info["n_heads"], info["n_query_heads"], info["repo_layers"]) == (3, 9, [])
    assert info["layer_modes"] == ["rope"] * 30
    tokens = explorer.tokens("The capital of France is Paris.")
    assert "".join(tokens["tokens"]) == "The capital of France is Paris." and not tokens["truncated"]
    with pytest.raises(BadRequest, match="has no RePo layer"):
        explorer.positions("The capital of France is Paris.")


def test_attention_mass_and_positions_of_its_repo_variant(smollm2_dir):  # noqa: F811
    """`RepoLlamaConfig.from_pretrained(dir, pe_mode="repo", pe_start_layer=9)`: the attention mass of a NIAH prompt
    is transformers' own eager weights of the last token (9 query heads averaged, each layer's row summing to one);
    the positions the analyses read are f_phi's of the attention's input (input_layernorm), 3 per token and layer
    9..29; f_phi untrained (init std 0.02) keeps them within a few hundredths of 0, so every chunk is constant
    (its span under 2 eps = 0.4, by a factor of ten)."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = RepoLlamaConfig.from_pretrained(smollm2_dir, pe_mode="repo", pe_start_layer=9)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, config=config).eval()
    sample = niah.niah_samples(tokenizer, "niah_single_1", LENGTH, n=1)[0]

    mass = attention_mass(model, tokenizer, sample.prompt, sample.needle_spans, sample.query_span)
    assert mass.repo_layers == tuple(range(9, 30))
    enc = tokenizer(sample.prompt, return_offsets_mapping=True)
    groups = token_groups(enc["offset_mapping"], sample.needle_spans, sample.query_span)  # [T]
    ids = torch.tensor([enc["input_ids"]])  # [1, T]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
    rows = torch.stack([a[0, :, -1, :] for a in out.attentions]).double().mean(1)  # [30, 9, T] -> [30, T]
    expected = torch.stack([rows[:, groups == g].mean(1) for g in range(3)], dim=1)  # [30, 3]
    torch.testing.assert_close(mass.per_layer, expected, rtol=1e-6, atol=1e-9)
    sums = (mass.per_layer * torch.bincount(groups, minlength=3)).sum(1)  # [30]: each row's total weight
    torch.testing.assert_close(sums, torch.ones(30, dtype=torch.float64))

    positions, _ = text_positions(model, tokenizer, sample.prompt)  # {layer: [3, T]}
    assert sorted(positions) == list(range(9, 30))
    with torch.no_grad():
        for layer, z in positions.items():
            a = model.model.layers[layer].self_attn
            x = model.model.layers[layer].input_layernorm(out.hidden_states[layer])  # [1, T, 576]
            truth = a.final_map(F.silu(a.gate_map(x)) * a.content_map(x))[0].T  # [3, T]
            torch.testing.assert_close(z, truth, rtol=1e-4, atol=1e-6)
    assert patterns_by_layer({layer: z[None] for layer, z in positions.items()})["all"]["constant"] == 1.0
    spans = spans_by_length(model, tokenizer, sample.prompt, [64, 256])  # {length: {layer: [3]}}
    for n, by_layer in spans.items():
        for layer, span in by_layer.items():
            z = positions[layer][:, :n]
            torch.testing.assert_close(span.float(), z.amax(-1) - z.amin(-1), rtol=1e-4, atol=1e-6)
            assert (span < 0.04).all()
