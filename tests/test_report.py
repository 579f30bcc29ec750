"""The report `make demo` ends with, end to end on tiny RoPE and RePo models (random weights, byte tokenizer)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from olmo_repo import repo_blocks
from olmo_repo.ai2olmo.hf import convert_to_hf
from olmo_repo.eval.report import (
    REPLACEMENT_NOTE,
    niah_section,
    replacement_table,
    report_sections,
    write_report,
)

from .conftest import make_checkpoint, spread_positions
from .pictures import axes_boxes, near, rgb, row_of, xticks

LENGTH = 768  # the byte tokenizer needs ~500 tokens for the smallest NIAH prompt, plus 128 to generate


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_file):
    """Tiny RePo and RoPE models, the same on every run. The RePo model's positions span hundreds (std ~20-35 over
    768 tokens, f_phi weights at std 2) and its RePo layer attends sharply (q and k norms x3), so that replacing
    its positions moves the attention table's three decimals: at `spread_positions`' default (std ~0.3) the
    learned and constant rows agreed to them on some draws."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for name, overrides in {"RePo": dict(pe_mode="repo", pe_start_layer=1), "RoPE": {}}.items():
            ckpt, model = make_checkpoint(
                root / name, tokenizer_file, n_layers=2, max_sequence_length=LENGTH, **overrides
            )
            if name == "RePo":
                spread_positions(model, std=2.0)
                with torch.no_grad():
                    for block in repo_blocks(model):
                        block.q_norm.weight.mul_(3)
                        block.k_norm.weight.mul_(3)
                torch.save(model.state_dict(), ckpt / "model.pt")
            out[name] = convert_to_hf(ckpt, root / f"{name}-hf")
    return out


@pytest.mark.slow
def test_report_end_to_end(models, tmp_path):
    (tmp_path / "notes.md").write_text("mine")
    report = write_report(
        tmp_path / "report.md",
        models,
        title="tiny",
        preamble="Measured elsewhere.\n",
        variants=["niah_single_1"],
        samples=2,
        tokens=1000,
    )
    text = report.read_text()
    assert report == tmp_path / "report.md" and text.startswith("# tiny\n\nMeasured elsewhere.\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures", "notes.md", "report.md"]
    for heading in ["Needle in a haystack", "Attention mass", "Learned positions: RePo", "Training cost"]:
        assert f"\n## {heading}\n" in text
    assert "Learned positions: RoPE" not in text  # a model without RePo layers has no positions to analyse
    # NIAH at the training length and at 2x and 4x with YaRN, one row per model, scores in percent; the
    # figure draws the table's numbers.
    assert "| model | 768 | 1536 (YaRN x2) | 3072 (YaRN x4) |" in text
    table = {}
    for name in models:
        row = re.search(rf"^\| {name} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
        table[name] = [float(v) for v in row.groups()]
    _check_niah_figure(tmp_path / "figures/niah.png", table)
    # Every linked figure exists, is a PNG, and is linked relative to the report.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(links) == sorted(
        f"figures/{name}.png"
        for name in [
            "niah",
            "attention-mass",
            "patterns-RePo",
            "spans-RePo",
            "spans-by-length-RePo",
            "positions-RePo",
        ]
    )
    for link in links:
        assert axes_boxes(rgb(tmp_path / link)), link  # a plot: at least one frame of axes
    # The FLOPs table: 6 N D with the f_phi weights only in the RePo model.
    repo_row = re.search(r"^\| RePo \| [\d,]+ \| ([\d,]+) \| ([\d,]+) \(", text, re.M)
    rope_row = re.search(r"^\| RoPE \| [\d,]+ \| ([\d,]+) \| 0 \(0\.00%\)", text, re.M)
    assert repo_row and rope_row and int(repo_row[2].replace(",", "")) > 0
    n_repo, n_rope = (int(m[1].replace(",", "")) for m in (repo_row, rope_row))
    assert n_repo - n_rope == int(repo_row[2].replace(",", ""))
    assert not list(tmp_path.glob(".report.md.partial-*"))  # written whole (output.write_file)


def test_models_of_different_lengths_are_refused(models, tmp_path, tokenizer_file):
    ckpt, _ = make_checkpoint(tmp_path / "short", tokenizer_file, n_layers=2, max_sequence_length=512)
    short = convert_to_hf(ckpt, tmp_path / "short-hf")
    with pytest.raises(ValueError, match=r"different lengths \[512, 768\]"):
        write_report(tmp_path / "out/report.md", {"a": models["RoPE"], "b": short}, samples=1)
    assert not (tmp_path / "out").exists()


def _check_niah_figure(path, table: dict[str, list[float]]) -> None:
    """The NIAH figure draws each model's percentages (table: {model: [score per length]}) as fractions, one
    line per model in the order of the table (colours C0, C1, ...). Where two models share a point, the one
    drawn last shows."""
    img = rgb(path)
    (box,) = axes_boxes(img)
    columns = xticks(img, box)
    rows = list(table.values())
    assert len(columns) == len(rows[0])
    for i, scores in enumerate(rows):
        for j, (col, score) in enumerate(zip(columns, scores)):
            if all(later[j] != score for later in rows[i + 1 :]):
                assert near(img, f"C{i}", row_of(box, score / 100, 0, 1.05), col), (i, j)


def test_niah_section_averages_each_group_in_percent(tmp_path):
    scores = {
        "RePo": {"a": {512: 1.0, 1024: 0.5}, "b": {512: 0.5, 1024: 0.0}, "c": {512: 0.25, 1024: 0.25}},
        "RoPE": {"a": {512: 0.0, 1024: 0.0}, "b": {512: 1.0, 1024: 1.0}, "c": {512: 0.75, 1024: 0.5}},
    }
    text = niah_section(scores, 512, tmp_path / "figures", {"seen": ["a", "b"], "held out": ["c"]})
    assert (
        "Average over the seen variants a, b:\n\n"
        "| model | 512 | 1024 (YaRN x2) |\n| --- | ---: | ---: |\n| RePo | 75.0 | 25.0 |\n| RoPE | 50.0 | 50.0 |\n"
    ) in text
    assert (
        "Average over the held out variants c:\n\n"
        "| model | 512 | 1024 (YaRN x2) |\n| --- | ---: | ---: |\n| RePo | 25.0 | 25.0 |\n| RoPE | 75.0 | 50.0 |\n"
    ) in text
    assert "| **average** | 58.3 | 25.0 |" in text and "| **average** | 58.3 | 50.0 |" in text  # per variant
    assert "![NIAH (seen)](figures/niah-seen.png) ![NIAH (held out)](figures/niah-held-out.png)" in text
    _check_niah_figure(tmp_path / "figures/niah-seen.png", {"RePo": [75.0, 25.0], "RoPE": [50.0, 50.0]})
    _check_niah_figure(tmp_path / "figures/niah-held-out.png", {"RePo": [25.0, 25.0], "RoPE": [75.0, 50.0]})


def test_replacement_table_compares_each_source_with_the_learned_positions():
    """{position source: {variant: {length: score}}}: a row per variant and length, then their average; a column
    per source in percent with its interval, and learned minus each replacement in points."""
    scores = {
        "constant": {"a": {512: 0.0, 1024: 0.0}, "b": {512: 0.5, 1024: 0.0}},
        "learned": {"a": {512: 1.0, 1024: 0.5}, "b": {512: 0.5, 1024: 0.25}},
        "index": {"a": {512: 0.75, 1024: 0.75}, "b": {512: 0.5, 1024: 0.0}},
    }
    lines = replacement_table(scores).splitlines()
    assert lines == [
        "| variant | length | learned | index | constant | learned - index | learned - constant |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| a | 512 | 100.0 | 75.0 | 0.0 | +25.0 | +100.0 |",
        "| a | 1024 | 50.0 | 75.0 | 0.0 | -25.0 | +50.0 |",
        "| b | 512 | 50.0 | 50.0 | 50.0 | +0.0 | +0.0 |",
        "| b | 1024 | 25.0 | 0.0 | 0.0 | +25.0 | +25.0 |",
        "| **average** | 512 | 75.0 | 62.5 | 25.0 | +12.5 | +50.0 |",
        "| **average** | 1024 | 37.5 | 37.5 | 0.0 | +0.0 | +37.5 |",
    ]
    with_intervals = replacement_table(scores, samples=20)
    assert "| a | 512 | 100.0 [83.9, 100.0] | 75.0 [53.1, 88.8] |" in with_intervals  # Wilson, 20 samples
    assert "| **average** | 512 | 75.0 [59.8, 85.8] |" in with_intervals  # 40 samples pooled (Wilson)
    assert "20 samples per cell" in with_intervals
    only_replacements = replacement_table(
        {"index": scores["index"]}
    ).splitlines()  # no learned: no differences
    assert only_replacements[0] == "| variant | length | index |"
    with pytest.raises(ValueError, match="no scores of a position source"):
        replacement_table({"rope": scores["index"]})


@pytest.mark.slow
def test_the_replacement_section_scores_each_source_on_the_same_prompts(models, tmp_path):
    """`report_sections(replaced=True)`: after the other sections (skipped here with `done`), one per RePo model with
    NIAH and the attention mass under the learned positions, the token index and a constant position."""
    sections = report_sections(
        models,
        tmp_path / "figures",
        variants=["niah_single_1"],
        samples=1,
        lengths=[LENGTH],
        replaced=True,
        done=3,
    )
    (text,) = list(sections)  # needles, attention and RePo's positions done; RoPE has no positions to replace
    assert text.startswith(f"## Positions replaced: RePo\n\n{REPLACEMENT_NOTE}\n")
    cell = r"([\d.]+) \[[\d.]+, [\d.]+\]"  # percent [95% interval]
    row = re.search(
        rf"^\| niah_single_1 \| {LENGTH} \| {cell} \| {cell} \| {cell} \| ([-+\d.]+) \| ([-+\d.]+) \|$",
        text,
        re.M,
    )
    learned, index, constant, minus_index, minus_constant = (float(v) for v in row.groups())
    assert (minus_index, minus_constant) == (round(learned - index, 1), round(learned - constant, 1))
    masses = {
        m[1]: [float(v) for v in m.groups()[1:]]
        for m in re.finditer(
            r"^\| (learned|index|constant) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M
        )
    }
    assert list(masses) == ["learned", "index", "constant"]
    assert (
        masses["index"] != masses["learned"] and masses["constant"] != masses["learned"]
    )  # the replacement acts
    assert not (tmp_path / "figures").exists()  # tables only


@pytest.mark.slow
def test_each_model_s_niah_scores_are_kept_as_they_finish_and_read_back_by_a_rerun(models, tmp_path):
    """`report_sections(kept=...)`: an evaluation killed after some models keeps their scores; the rerun reads
    them (here one altered by hand, which the rerun's table shows) and scores only the others."""
    kept = tmp_path / "kept"
    options = dict(variants=["niah_single_1"], samples=1, lengths=[LENGTH], kept=kept)
    first = next(report_sections(models, tmp_path / "figures", **options))
    assert sorted(p.name for p in kept.iterdir()) == ["niah-RePo-learned.json", "niah-RoPE-learned.json"]
    altered = kept / "niah-RePo-learned.json"
    altered.write_text(json.dumps({"niah_single_1": {str(LENGTH): 0.123}}))
    (kept / "niah-RoPE-learned.json").unlink()  # as if killed before RoPE finished
    again = next(report_sections(models, tmp_path / "figures", **options))
    assert re.search(r"^\| RePo \| 12\.3\b", again, re.M), again
    assert (
        re.search(r"^\| RoPE \| ([\d.]+)", again, re.M)[1]
        == re.search(r"^\| RoPE \| ([\d.]+)", first, re.M)[1]
    )
    assert (kept / "niah-RoPE-learned.json").is_file()
