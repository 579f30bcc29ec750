"""Chunk patterns, spans, spread and order of learned positions, on sequences whose answer is known by
construction; spans at several context lengths, position labels and the positions shown when an evaluation
replaces the learned ones, on a tiny RePo HF model."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2)
from olmo_repo.ai2olmo.hf import convert_to_hf
from olmo_repo.eval.loading import load_model
from olmo_repo.eval.positions import (
    batch_positions,
    pattern_counts,
    pattern_table,
    patterns_by_layer,
    position_patterns,
    position_spans,
    span_table,
    spans_by_length,
    spread_by_layer,
    spread_table,
    text_positions,
)
from olmo_repo.positions import spread

from .conftest import make_checkpoint


def _seq(*chunks: list[float]) -> torch.Tensor:
    return torch.tensor([v for c in chunks for v in c], dtype=torch.float32)


CONSTANT = [5.0, 5.1, 5.3, 5.2]  # max - min = 0.3 <= 2 * 0.2
INCREASING = [0.0, 1.0, 1.5, 4.0]
DECREASING = [3.0, 2.0, 0.5, -7.0]
HYBRID = [0.0, 2.0, 1.0, 3.0]


def test_each_pattern_is_recognised():
    z = _seq(CONSTANT, INCREASING, DECREASING, HYBRID, HYBRID)
    assert pattern_counts(z, chunk=4).tolist() == [1, 2, 2]
    assert position_patterns(z, chunk=4) == {"constant": 0.2, "monotonic": 0.4, "hybrid": 0.4}


def test_constant_is_decided_by_two_eps_before_monotonic():
    rising_slowly = [0.0, 0.1, 0.2, 0.39]  # monotonic, but within 2 * eps: constant
    assert position_patterns(_seq(rising_slowly), chunk=4)["constant"] == 1.0
    assert position_patterns(_seq(rising_slowly), chunk=4, eps=0.1)["monotonic"] == 1.0
    # A flat step (a zero difference) is not monotonic.
    assert position_patterns(_seq([0.0, 1.0, 1.0, 2.0]), chunk=4)["hybrid"] == 1.0


def test_leading_axes_are_sequences_and_fractions_sum_to_one():
    z = torch.stack([_seq(CONSTANT, HYBRID), _seq(INCREASING, INCREASING)])[None]  # [B=1, H=2, T=8]
    fractions = position_patterns(z, chunk=4)
    assert fractions == {"constant": 0.25, "monotonic": 0.5, "hybrid": 0.25}
    assert math.isclose(sum(fractions.values()), 1.0)
    # Chunks never cross a sequence: the same chunks as 4 sequences of 4 give the same fractions.
    assert position_patterns(z.reshape(1, 4, 4), chunk=4) == fractions
    assert position_patterns(z, chunk=8) == {
        "constant": 0.0,
        "monotonic": 0.0,
        "hybrid": 1.0,
    }


def test_remainder_is_left_out_and_short_sequences_are_one_chunk():
    z = _seq(INCREASING, HYBRID, [9.0, 0.0, 4.0])  # T = 11, chunk 4: the last 3 tokens are not a chunk
    assert pattern_counts(z, chunk=4).tolist() == [0, 1, 1]
    assert pattern_counts(_seq(HYBRID[:3]), chunk=16).tolist() == [0, 0, 1]
    assert position_patterns(torch.tensor([3.0]), chunk=16) == {
        "constant": 1.0,
        "monotonic": 0.0,
        "hybrid": 0.0,
    }


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        position_patterns(torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="at least one token"):
        position_patterns(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="chunk"):
        position_patterns(torch.zeros(4), chunk=0)
    with pytest.raises(ValueError, match="no positions"):
        patterns_by_layer({})


def test_per_layer_and_pooled():
    by_layer = patterns_by_layer(
        {7: _seq(CONSTANT)[None, None], 3: _seq(HYBRID, HYBRID, INCREASING)[None, None]}, chunk=4
    )
    assert list(by_layer) == [3, 7, "all"]
    assert by_layer[7]["constant"] == 1.0
    assert by_layer["all"] == {"constant": 0.25, "monotonic": 0.25, "hybrid": 0.5}


def test_spans():
    z = torch.tensor([[[0.0, 4.0, -1.5], [2.0, 2.0, 2.0]]])  # [B=1, H=2, T=3]
    assert position_spans(z).tolist() == [[5.5, 0.0]]


# --------------------------------------------------------------------------------- on a model, tables

TEXT = (
    "The code of amber is 512. The code of falcon is 907. Question: what is the code of amber? Answer: 512."
)
OTHER = "Count: 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79, 83, 87, 91."


@pytest.fixture(scope="module")
def repo_hf(tmp_path_factory, tokenizer_file):
    """A tiny RePo HF model (layers 1..3) and its byte-level tokenizer (one token per ASCII character)."""
    root = tmp_path_factory.mktemp("repo")
    ckpt, _ = make_checkpoint(
        root / "olmo", tokenizer_file, max_sequence_length=128, pe_mode="repo", pe_start_layer=1
    )
    hf_dir = convert_to_hf(ckpt, root / "hf")
    return AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)


def test_replaced_positions_are_what_the_layers_rotate_by(repo_hf):
    """A model loaded with its positions replaced (`--positions`) predicts none: its RePo layers rotate by the token
    index, or by one position for every token, and that is what the analyses show of it."""
    model, tokenizer = repo_hf
    learned, _ = text_positions(model, tokenizer, TEXT, max_tokens=40)
    index = torch.arange(40.0).expand(4, 40)  # [H_kv, T]
    for source, expected in {"index": index, "constant": torch.zeros(4, 40)}.items():
        replaced = load_model(model.name_or_path, 128, positions=source)
        positions, _ = text_positions(replaced, tokenizer, TEXT, max_tokens=40)
        assert sorted(positions) == sorted(learned) == [1, 2, 3], source
        for z in positions.values():
            assert z.dtype == torch.float32 and torch.equal(z, expected), source
    assert all(not torch.equal(z, index) for z in learned.values())


def test_spans_by_length_equal_separate_forwards(repo_hf):
    model, tokenizer = repo_hf
    spans = spans_by_length(model, tokenizer, [TEXT, OTHER], [64, 8, 32])
    assert list(spans) == [8, 32, 64] and all(sorted(s) == [1, 2, 3] for s in spans.values())
    ids = torch.tensor([tokenizer(t)["input_ids"][:64] for t in (TEXT, OTHER)])
    for n, by_layer in spans.items():
        with torch.no_grad():
            positions = model(ids[:, :n], output_positions=True).positions  # a fresh forward of n tokens
        for layer, z in positions.items():
            expected = position_spans(z).mean(0)  # [H], mean over the two texts
            assert by_layer[layer].shape == (4,) and expected.max() > 1  # positions spread (spread_positions)
            tol = 64 * torch.finfo(torch.float32).eps * z.abs().max().item()
            torch.testing.assert_close(by_layer[layer], expected, rtol=0, atol=tol)
    assert spans_by_length(model, tokenizer, TEXT, [8])[8][2].shape == (4,)  # one text as a string
    assert batch_positions(model, tokenizer, [TEXT, OTHER], 16)[3].shape == (2, 4, 16)
    with pytest.raises(ValueError, match="need 500 tokens"):
        spans_by_length(model, tokenizer, [TEXT], [500])


def test_text_positions_and_labels(repo_hf):
    model, tokenizer = repo_hf
    positions, labels = text_positions(model, tokenizer, TEXT, max_tokens=40)
    assert "".join(labels) == TEXT[:40] and sorted(positions) == [1, 2, 3]
    with torch.no_grad():
        full = model(torch.tensor([tokenizer(TEXT)["input_ids"][:40]]), output_positions=True).positions
    for layer, z in positions.items():
        assert z.shape == (4, 40)
        torch.testing.assert_close(z, full[layer][0], rtol=0, atol=0)
    assert len(text_positions(model, tokenizer, TEXT)[1]) == len(TEXT)


def test_models_without_repo_layers_are_refused(tmp_path, tokenizer_file):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="nope")
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)
    with pytest.raises(ValueError, match="no RePo layer"):
        spans_by_length(model, tokenizer, TEXT, [8])


def test_spread_and_order_per_layer_are_the_trainers_statistics():
    """`rope.spread` per layer: every value of [B, H, T] for the extremes, std and percentiles; Spearman's rank
    correlation with the token index per (sequence, head) row, averaged."""
    up, down = torch.arange(5.0), torch.arange(5.0).flip(0)
    positions = {
        3: torch.stack([torch.stack([up, down])]),  # [1, 2, 5]: ordered, reversed
        1: torch.stack([torch.stack([2 * up, up + 1])]),  # both ordered
    }
    stats = spread_by_layer(positions)
    assert list(stats) == [1, 3]
    assert stats[3] == spread(positions[3])
    assert stats[3]["rank_corr"] == pytest.approx(0.0) and stats[1]["rank_corr"] == pytest.approx(1.0)
    values = torch.tensor([0.0, 0, 1, 1, 2, 2, 3, 3, 4, 4])  # layer 3's values, sorted
    assert (stats[3]["min"], stats[3]["max"], stats[3]["p05"], stats[3]["p95"]) == (0.0, 4.0, 0.0, 4.0)
    assert stats[3]["std"] == pytest.approx(values.std().item())  # sqrt(20 / 9)
    assert spread_table(stats).splitlines() == [
        "| layer | min | max | std | p05 | p95 | rank_corr |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| 1 | 0.000 | 8.000 | {stats[1]['std']:.3f} | {stats[1]['p05']:.3f} | {stats[1]['p95']:.3f} | 1.000 |",
        "| 3 | 0.000 | 4.000 | 1.491 | 0.000 | 4.000 | 0.000 |",
    ]
    with pytest.raises(ValueError, match="no positions"):
        spread_by_layer({})


def test_tables():
    spans = {
        8: {1: torch.tensor([1.0, 3.0]), 2: torch.tensor([2.0, 6.0])},
        16: {1: torch.tensor([0.5, 1.5]), 2: torch.tensor([4.0, 9.0])},
    }
    assert span_table(spans).splitlines()[2:] == [
        "| 8 | 7 | 3.00 | 6.00 | 0.857 |",
        "| 16 | 15 | 3.75 | 9.00 | 0.600 |",
    ]
    patterns = {
        3: {"constant": 0.25, "monotonic": 0.0, "hybrid": 0.75},
        "all": {"constant": 0.5, "monotonic": 0.125, "hybrid": 0.375},
    }
    assert pattern_table(patterns).splitlines() == [
        "| layer | constant | monotonic | hybrid |",
        "| --- | ---: | ---: | ---: |",
        "| 3 | 25.0% | 0.0% | 75.0% |",
        "| all | 50.0% | 12.5% | 37.5% |",
    ]
