"""Chunk patterns and spans of learned positions, on sequences whose answer is known by construction."""

from __future__ import annotations

import math

import pytest
import torch

from olmo_repo.eval.positions import pattern_counts, patterns_by_layer, position_patterns, position_spans


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
