"""Every plot is written as a non-empty PNG with something drawn on it; `scripts/plot_positions.py` end to end on a
tiny OLMo checkpoint (converted on the fly), and its errors."""

from __future__ import annotations

import re

import matplotlib.image
import pytest
import torch

from olmo_repo.cli.plot_positions import main as plot_positions_main
from olmo_repo.eval import plots
from olmo_repo.eval.attention import AttentionMass

from .conftest import make_checkpoint

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_png(path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = matplotlib.image.imread(path)  # [height, width, RGBA] in [0, 1]
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_each_plot_is_written(tmp_path):
    spans = {n: {1: torch.rand(4) * n, 2: torch.rand(4) * n / 2} for n in (16, 32, 64)}
    tokens = ["The", " code", " of", " $x", "\n", " ", "is", " 5"] * 4
    written = [
        plots.plot_positions(torch.randn(32).cumsum(0), tokens, tmp_path / "new" / "positions.png"),
        plots.plot_span_heatmap(spans[64], tmp_path / "heatmap.png"),
        plots.plot_spans_by_length(spans, tmp_path / "spans.png"),
        plots.plot_pattern_shares(
            {
                1: {"constant": 0.2, "monotonic": 0.05, "hybrid": 0.75},
                "all": {"constant": 0.22, "monotonic": 0.04, "hybrid": 0.74},
            },
            tmp_path / "patterns.png",
        ),
        plots.plot_attention_mass(
            {
                "RePo": AttentionMass(torch.rand(4, 3, dtype=torch.float64) / 50, (1, 2, 3)),
                "RoPE": AttentionMass(torch.rand(4, 3, dtype=torch.float64) / 50, ()),
            },
            tmp_path / "mass.png",
        ),
        plots.plot_niah_accuracy(
            {"RePo": {128: 0.9, 256: 0.6, 512: 0.3}, "RoPE": {128: 0.8, 256: 0.4}}, tmp_path / "niah.png"
        ),
        plots.plot_niah_curves(
            {
                "seen": {"RoPE": {0: 1.0, 50: 0.9}, "RePo": {0: 0.1, 50: 0.4}},
                "held out": {"RoPE": {0: 0.2, 50: 0.25}, "RePo": {0: 0.0, 50: 0.1}},
            },
            tmp_path / "curves.png",
            baseline={"seen": 1.0, "held out": 0.2},
            start=0,
        ),
    ]
    for path in written:
        _check_png(path)
    with pytest.raises(ValueError, match="no curves"):
        plots.plot_niah_curves({"seen": {}}, tmp_path / "empty.png")
    # A long text: labels are thinned out, not dropped.
    _check_png(plots.plot_positions(torch.randn(1000), ["tok"] * 1000, tmp_path / "long.png"))


def test_plots_refuse_what_they_cannot_draw(tmp_path):
    with pytest.raises(ValueError, match="one token per position"):
        plots.plot_positions(torch.zeros(3), ["a", "b"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="no spans"):
        plots.plot_span_heatmap({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="no NIAH scores"):
        plots.plot_niah_accuracy({"RePo": {}}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


TEXT = "The code of amber is 512. Question: what is the code of amber? Answer: 512."


def test_plot_positions_command(tmp_path, tokenizer_file, capsys):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    out = tmp_path / "plots" / "positions.png"
    args = [str(ckpt), "--text", TEXT, "--layer", "2", "--head", "3", "--out", str(out)]
    assert plot_positions_main(args) == 0
    _check_png(out)
    assert f"wrote {out}" in capsys.readouterr().out

    before = out.read_bytes()
    assert plot_positions_main(args) == 1  # an existing file is the user's: replaced only with --force
    assert "exists; pass --force" in capsys.readouterr().err and out.read_bytes() == before
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT * 3, encoding="utf-8")
    args = [str(ckpt), "--text-file", str(text_file), "--max-tokens", "64", "--out", str(out), "--force"]
    assert plot_positions_main(args) == 0

    for bad, message in [
        (["--layer", "0"], "--layer 0 is not a RePo layer of .*; RePo layers: \\[1, 2, 3\\]"),
        (["--head", "4"], "--head 4 is out of range: the model has 4 heads"),
    ]:
        other = tmp_path / "other.png"
        assert plot_positions_main([str(ckpt), "--text", TEXT, "--out", str(other), *bad]) == 1
        err = capsys.readouterr().err
        errors = [
            line for line in err.splitlines() if line.startswith("plot_positions.py: error:")
        ]  # (stderr also has progress)
        assert len(errors) == 1 and re.search(message, errors[0]) and "Traceback" not in err, err
        assert not other.exists()
    assert (
        plot_positions_main([str(tmp_path / "missing"), "--text", TEXT, "--out", str(tmp_path / "m.png")])
        == 1
    )
    assert "not a model directory" in capsys.readouterr().err
