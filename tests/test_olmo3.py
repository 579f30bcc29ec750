"""OLMo 3 (`repo_olmo3`: sliding windows, a RoPE per layer type, grouped-query attention) in the tools that take
Hugging Face models: the evaluation command (YaRN on the full-attention layers only), the explorer and the
attention-mass analysis. Its parity with OLMo-core and vLLM is in tests/core and tests/vllm."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from olmo_repo.cli.eval import main
from olmo_repo.eval.attention import attention_mass
from olmo_repo.eval.loading import load_model
from olmo_repo.explore.model import ExplorerModel
from olmo_repo.hf import RepoOlmo3Config, RepoOlmo3ForCausalLM, read_hf_config
from olmo_repo.hf.files import save_hf, save_tokenizer

from .conftest import EMBEDDING, EOS, PAD

TRAINED = 768
DEFAULT = {"rope_type": "default", "rope_theta": 500_000.0}
PROMPT = "The grass is green. " * 8 + "One of the special magic numbers for red-fox is: 1234567. What is it?"


@pytest.fixture(scope="module")
def olmo3_dir(tmp_path_factory, tokenizer_file):
    """A tiny `repo_olmo3` directory as the converters write it (remote code, tokenizer): 32-token windows in
    layers 0-2, full attention in layer 3, RePo from layer 1, 2 key/value heads for 4 query heads."""
    config = RepoOlmo3Config(
        vocab_size=EMBEDDING,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TRAINED,
        sliding_window=32,
        rope_parameters={"sliding_attention": dict(DEFAULT), "full_attention": dict(DEFAULT)},
        pe_mode="repo",
        pe_start_layer=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    model = RepoOlmo3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.self_attn.final_map.weight.normal_(std=0.5)  # positions spread over tens
    out = tmp_path_factory.mktemp("olmo3") / "hf"
    out.mkdir()
    save_hf(config, model.state_dict(), out, None)
    save_tokenizer(Tokenizer.from_file(str(tokenizer_file)), config, out)
    return out


def test_the_directory_loads_as_written(olmo3_dir):
    config = read_hf_config(olmo3_dir)
    assert isinstance(config, RepoOlmo3Config) and config.layer_types[1] == "sliding_attention"
    saved = json.loads((olmo3_dir / "config.json").read_text())
    assert saved["auto_map"]["AutoConfig"] == "configuration_repo_olmo3.RepoOlmo3Config"
    model = AutoModelForCausalLM.from_pretrained(olmo3_dir, trust_remote_code=True)
    assert type(model).__name__ == "RepoOlmo3ForCausalLM"


@pytest.mark.slow  # several forwards
def test_yarn_scales_the_full_attention_layers_only(olmo3_dir, tmp_path):
    """At 2x the training length the full-attention layer's RoPE (and the RePo positions it rotates) takes
    YaRN; the sliding-window layers keep theirs, as OLMo 3's own long-context models do. The command records
    both and scores every sample."""
    scaled = load_model(olmo3_dir, 2 * TRAINED)
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": TRAINED}
    assert yarn.items() <= scaled.config.rope_parameters["full_attention"].items()
    assert scaled.config.rope_parameters["sliding_attention"]["rope_type"] == "default"
    full = scaled.model.layers[3].self_attn
    assert full.rope_frequencies("cpu")[1] > 1.0  # YaRN's attention factor reaches the RePo layer
    assert scaled.model.layers[1].self_attn.rope_frequencies("cpu")[1] == 1.0

    out = tmp_path / "out"
    flags = ["--tasks", "niah_single_1", "--lengths", f"{TRAINED},{2 * TRAINED}", "--samples", "1"]
    assert main([str(olmo3_dir), *flags, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["training_length"] == TRAINED
    assert results["lengths"][str(TRAINED)]["rope_parameters"]["full_attention"]["rope_type"] == "default"
    long = results["lengths"][str(2 * TRAINED)]["rope_parameters"]
    assert (
        yarn.items() <= long["full_attention"].items() and long["sliding_attention"]["rope_type"] == "default"
    )
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2


def test_the_explorer_shows_one_position_per_key_value_head(olmo3_dir):
    model = ExplorerModel(olmo3_dir)
    assert model.info()["n_heads"] == 2 and model.info()["n_query_heads"] == 4
    out = model.positions(PROMPT)
    hf = AutoModelForCausalLM.from_pretrained(olmo3_dir).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([out["token_ids"]]), output_positions=True).positions
    assert out["layers"] == [1, 2, 3] and out["heads"] == [0, 1]
    for i, layer in enumerate(out["layers"]):
        assert torch.equal(torch.tensor(out["positions"][i]), expected[layer][0])


def test_attention_mass_covers_every_layer(olmo3_dir):
    """The analysis hooks OLMo 3's attentions too (stock Olmo3Attention in layer 0, the RePo ones after)."""
    model = AutoModelForCausalLM.from_pretrained(olmo3_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(olmo3_dir)
    needle = PROMPT.index("One of")
    mass = attention_mass(
        model, tokenizer, PROMPT, [(needle, needle + 50)], (PROMPT.index("What"), len(PROMPT))
    )
    assert mass.per_layer.shape == (4, 3) and mass.repo_layers == (1, 2, 3)
    assert (mass.per_layer > 0).all() and (mass.per_layer <= 1).all()
