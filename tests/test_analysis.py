"""Report sections end to end on tiny RoPE and RePo HF models: what a report (make demo) will call."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2)
from olmo_repo.ai2olmo.hf import convert_to_hf
from olmo_repo.eval.analysis import NeedlePrompt, attention_section, positions_section
from olmo_repo.eval.attention import AttentionMass, attention_mass, attention_mass_table
from olmo_repo.eval.positions import batch_positions, spread_by_layer, spread_table, text_positions

from .conftest import make_checkpoint
from .pictures import affine_residual, axes_boxes, height_of, rgb, runs, xticks, yticks


def _prompt(key: str, value: str, filler: int) -> NeedlePrompt:
    needle = f"One of the special magic numbers for {key} is: {value}."
    question = f"What is the special magic number for {key}? The answer is"
    prompt = "The grass is green. " * filler + needle + " The sky is blue." * 3 + " " + question
    start = prompt.index(needle)
    return NeedlePrompt(prompt, [(start, start + len(needle))], (prompt.index(question), len(prompt)))


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_file):
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, overrides in {"RoPE": {}, "RePo": dict(pe_mode="repo", pe_start_layer=1)}.items():
        ckpt, _ = make_checkpoint(root / name, tokenizer_file, max_sequence_length=256, **overrides)
        hf_dir = convert_to_hf(ckpt, root / f"{name}-hf")
        out[name] = AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)
    return out


@pytest.mark.slow
def test_attention_section(models, tmp_path):
    prompts = [_prompt("lucky-dove", "7043913", 2), _prompt("red-fox", "1234567", 4)]
    section = attention_section(models, prompts, tmp_path)
    assert [f.name for f in section.figures] == ["attention-mass.png"]
    img = rgb(section.figures[0])
    boxes = axes_boxes(img)  # needle, query, other; a point per layer, the RePo layers (1..3) shaded
    assert len(boxes) == 3 and all(len(xticks(img, box)) == 4 for box in boxes)
    top, bottom, _, _ = boxes[0]
    columns = xticks(img, boxes[0])
    bands = [img[top + 3 : bottom - 2, round(c + (columns[1] - columns[0]) / 4)].mean() for c in columns]
    assert bands[0] > 0.97 and all(band < 0.95 for band in bands[1:]), bands
    assert "![attention mass](attention-mass.png)" in section.markdown and "2 prompts" in section.markdown
    # The table is the average of the per-prompt measurements.
    by_hand = {}
    for name, (model, tokenizer) in models.items():
        masses = [attention_mass(model, tokenizer, p.prompt, p.needle_spans, p.query_span) for p in prompts]
        by_hand[name] = AttentionMass((masses[0].per_layer + masses[1].per_layer) / 2, masses[0].repo_layers)
    assert attention_mass_table(by_hand) in section.markdown
    with pytest.raises(ValueError, match="no NIAH prompts"):
        attention_section(models, [], tmp_path)


@pytest.mark.slow
def test_positions_section(models, tmp_path):
    model, tokenizer = models["RePo"]
    texts = [_prompt("lucky-dove", "7043913", 3).prompt, _prompt("red-fox", "1234567", 4).prompt]
    # a model's name is the report's, a figure's file a name a Markdown link takes as it is (no space or comma)
    section = positions_section("RePo, learning", model, tokenizer, texts, [16, 32, 64], tmp_path / "report")
    names = [f.name for f in section.figures]
    assert names == [
        f"{kind}-RePo-learning.png" for kind in ("patterns", "spans", "spans-by-length", "positions")
    ]
    for figure in section.figures:
        assert figure.parent == tmp_path / "report" and f"({figure.name})" in section.markdown
    patterns, spans, by_length, positions = (rgb(f) for f in section.figures)
    (box,) = axes_boxes(patterns)
    top, bottom, left, right = box
    assert len(runs(patterns[bottom - 3, left + 3 : right - 2].max(-1) < 0.9)) == 4  # bars: layers 1..3, all
    (box,) = axes_boxes(spans, min_len=200)  # (not the colour bar)
    assert (len(xticks(spans, box)), len(yticks(spans, box))) == (4, 3)  # heads x RePo layers
    (box,) = axes_boxes(by_length)
    assert len(xticks(by_length, box)) == 3  # the lengths 16, 32, 64
    # The last RePo layer's head 0 on the first text, one point per token.
    expected, _ = text_positions(model, tokenizer, texts[0], max_tokens=64)
    (box,) = axes_boxes(positions)
    columns = xticks(positions, box)
    assert len(columns) == 64
    heights = [height_of(positions, box, "C0", c) for c in columns]
    slope, residual = affine_residual(expected[3][0].tolist(), heights)
    assert slope < 0 and residual <= 2
    assert "| layer | constant | monotonic | hybrid |" in section.markdown
    # spread and order per layer, as the trainers log them, over the texts at the longest length
    assert spread_table(spread_by_layer(batch_positions(model, tokenizer, texts, 64))) in section.markdown
    assert "| layer | min | max | std | p05 | p95 | rank_corr |" in section.markdown
    assert "| 64 | 63 |" in section.markdown
    with pytest.raises(ValueError, match="no RePo layer"):
        positions_section("RoPE", *models["RoPE"], texts, [16], tmp_path)


@pytest.mark.slow
def test_positions_section_of_a_grouped_query_model_is_per_key_value_head(tmp_path, tokenizer_file):
    """4 query heads, 2 key/value heads: the section says what its heads are, and its spans have 2 of them."""
    ckpt, _ = make_checkpoint(
        tmp_path / "olmo",
        tokenizer_file,
        max_sequence_length=256,
        pe_mode="repo",
        pe_start_layer=1,
        n_kv_heads=2,
    )
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)
    texts = [_prompt("lucky-dove", "7043913", 3).prompt]
    section = positions_section("GQA", model, tokenizer, texts, [16, 32], tmp_path / "report")
    assert section.markdown.startswith("Positions are predicted per key/value head (2 query heads share its")
    spans = rgb(section.figures[1])
    (box,) = axes_boxes(spans, min_len=200)
    assert (len(xticks(spans, box)), len(yticks(spans, box))) == (2, 3)  # key/value heads x RePo layers
