"""Training FLOPs and parameter counts against the paper's published figures (models built on the meta device)."""

from __future__ import annotations

import dataclasses

import pytest

from olmo_repo import RepoTrainConfig
from olmo_repo.cli.flops import main as flops_main
from olmo_repo.flops import parameter_count, training_flops

from .conftest import CONFIGS, tiny_config


def _model(name: str):
    return RepoTrainConfig.load(CONFIGS / name, validate_paths=False).model


def test_1b_reproduces_the_papers_flops_and_overhead():
    rope, repo = _model("baseline-1B-rope.yaml"), _model("official-1B-repo.yaml")
    # The paper: 3.84e20 (RoPE) vs 3.87e20 (RePo) for OLMo-2 1B on 50B tokens, +0.9% parameters.
    assert f"{training_flops(rope, 50e9):.3g}" == "3.84e+20"
    assert f"{training_flops(repo, 50e9):.3g}" == "3.87e+20"
    base, ours = parameter_count(rope), parameter_count(repo)
    assert base.non_embedding == 1_279_395_840 and base.repo == 0
    # f_phi: 11 RePo layers x (2 x 2048 x 256 + 256 x 16), and nothing else differs.
    assert ours.repo == 11 * (2 * 2048 * 256 + 256 * 16) == ours.non_embedding - base.non_embedding
    assert round(100 * ours.repo_overhead, 1) == 0.9 and abs(ours.repo_overhead - 0.00905) < 5e-6
    # The convention: N leaves out the input embedding only (the untied output projection counts).
    assert base.total - base.non_embedding == rope.embedding_size * rope.d_model
    assert ours.training_flops(50e9, with_repo=False) == training_flops(rope, 50e9)


def test_7b_counts_follow_from_its_shape():
    config = _model("official-7B-repo.yaml")
    count = parameter_count(config)
    d, hidden = config.d_model, config.mlp_hidden_size // 2
    block = 4 * d * d + 3 * d * hidden + 4 * d  # q, k, v, o; up, gate, down; q/k norms, 2 block norms
    assert count.repo == 22 * (2 * d * (d // 8) + (d // 8) * config.n_heads)  # RePo in layers 10..31
    assert count.non_embedding == 32 * block + d + config.embedding_size * d + count.repo  # + ln_f, output
    assert training_flops(config, 1e9) == 6 * count.non_embedding * 1e9


def test_the_config_is_not_modified_and_bad_tokens_are_refused():
    config = tiny_config(pe_mode="repo", pe_start_layer=1)
    before = dataclasses.asdict(config)
    assert parameter_count(config).repo == 3 * (2 * 64 * 8 + 8 * 4)
    assert dataclasses.asdict(config) == before
    with pytest.raises(ValueError, match="tokens"):
        training_flops(config, -1)


def test_command_prints_the_table(capsys):
    assert flops_main([str(CONFIGS / "official-1B-repo.yaml"), "--tokens", "50e9"]) == 0
    out = capsys.readouterr().out
    assert "| 1,290,975,232 | 11,579,392 | 0.905% | 3.84e20 | 3.87e20 |" in out
    assert flops_main(["missing.yaml"]) == 1
    assert "missing.yaml" in capsys.readouterr().err


def test_grouped_query_attention_counts_final_maps_rows_per_key_value_head():
    """OLMo 2 32B's grouping (40 query, 8 key/value heads) at a small width: final_map has one row per
    key/value head, and the key/value projections are smaller too."""
    gqa = tiny_config(d_model=80, n_heads=40, n_kv_heads=8, pe_mode="repo", pe_start_layer=1)
    mha = dataclasses.replace(gqa, n_kv_heads=None)
    assert parameter_count(gqa).repo == 3 * (2 * 80 * 10 + 10 * 8)
    assert parameter_count(mha).repo == 3 * (2 * 80 * 10 + 10 * 40)
    # The non-embedding difference per layer: k and v lose 32 heads x 2 dims of rows (of width 80) and the
    # k norm their 64 weights; in the 3 RePo layers final_map loses 32 rows of 10.
    saved = 4 * (2 * 64 * 80 + 64) + 3 * 10 * 32
    assert parameter_count(mha).non_embedding - parameter_count(gqa).non_embedding == saved
