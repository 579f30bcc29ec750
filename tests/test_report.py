"""The report `make demo` ends with, end to end on tiny RoPE and RePo models (random weights, byte tokenizer)."""

from __future__ import annotations

import re

import pytest

from olmo_repo.eval.report import write_report
from olmo_repo.hf.convert import convert_to_hf

from .conftest import make_checkpoint
from .test_plots import PNG_MAGIC

LENGTH = 768  # the byte tokenizer needs ~500 tokens for the smallest NIAH prompt, plus 128 to generate


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_file):
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, overrides in {"RePo": dict(pe_mode="repo", pe_start_layer=1), "RoPE": {}}.items():
        ckpt, _ = make_checkpoint(
            root / name, tokenizer_file, n_layers=2, max_sequence_length=LENGTH, **overrides
        )
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
    # NIAH at the training length and at 2x and 4x with YaRN, one row per model, scores in percent.
    assert "| model | 768 | 1536 (YaRN x2) | 3072 (YaRN x4) |" in text
    for name in models:
        row = re.search(rf"^\| {name} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
        assert row and all(0 <= float(v) <= 100 for v in row.groups())
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
        assert (tmp_path / link).read_bytes()[:8] == PNG_MAGIC
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
