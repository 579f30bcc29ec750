"""Every plot draws its data where a reader of the PNG looks for it (read back through `tests/pictures.py`:
the frames, the ticks and the colours of the lines, bars and cells); `scripts/plot_positions.py` end to end on
a tiny OLMo checkpoint (converted on the fly), and its errors."""

from __future__ import annotations

import math
import re

import matplotlib
import numpy as np
import pytest
import torch

from olmo_repo.cli.plot_positions import main as plot_positions_main
from olmo_repo.eval import plots
from olmo_repo.eval.attention import AttentionMass

from .conftest import make_checkpoint
from .pictures import (
    affine_residual,
    axes_boxes,
    col_of,
    height_of,
    matches,
    near,
    rgb,
    row_of,
    runs,
    xticks,
    yticks,
)

MARGIN = matplotlib.rcParams["axes.xmargin"]  # matplotlib's padding of automatic limits (0.05)


def _auto(low: float, high: float) -> tuple[float, float]:
    return low - MARGIN * (high - low), high + MARGIN * (high - low)


def test_niah_accuracy_draws_each_models_scores(tmp_path):
    scores = {"RePo": {128: 0.9, 256: 0.6, 512: 0.3}, "RoPE": {128: 0.2, 256: 0.4}}
    img = rgb(plots.plot_niah_accuracy(scores, tmp_path / "niah.png"))
    (box,) = axes_boxes(img)
    columns = dict(zip([128, 256, 512], xticks(img, box)))  # one tick per length, equally spaced (log 2)
    assert len(columns) == 3 and math.isclose(
        columns[256] - columns[128], columns[512] - columns[256], abs_tol=2
    )
    for colour, other, by_length in (("C0", "C1", scores["RePo"]), ("C1", "C0", scores["RoPE"])):
        for n, score in by_length.items():
            row = row_of(box, score, 0, 1.05)  # fractions: the y axis ends at 1.05
            assert near(img, colour, row, columns[n]) and not near(img, other, row, columns[n]), (colour, n)
    # Percentages: the y axis ends at 105.
    img = rgb(plots.plot_niah_accuracy({"RePo": {128: 50.0, 256: 100.0}}, tmp_path / "percent.png"))
    (box,) = axes_boxes(img)
    for col, score in zip(xticks(img, box), (50.0, 100.0)):
        assert near(img, "C0", row_of(box, score, 0, 105), col)


def test_niah_curves_draw_a_panel_per_group_with_baseline_and_start(tmp_path):
    curves = {
        "seen": {"RoPE": {0: 1.0, 50: 0.9}, "RePo": {0: 0.1, 50: 0.4}},
        "held out": {"RoPE": {0: 0.2, 50: 0.25}, "RePo": {0: 0.0, 50: 0.1}},
    }
    baseline = {"seen": 1.0, "held out": 0.2}
    img = rgb(plots.plot_niah_curves(curves, tmp_path / "curves.png", baseline=baseline, start=0))
    boxes = axes_boxes(img)
    assert len(boxes) == 2
    shade = img.mean(-1)
    grey = (img.max(-1) - img.min(-1) < 0.03) & (shade > 0.3) & (shade < 0.7)  # thin grey lines, antialiased
    for box, (group, by_model) in zip(boxes, curves.items()):
        top, bottom, left, right = box
        x_low, x_high = _auto(0, 50)
        for colour, by_step in zip(("C0", "C1"), by_model.values()):
            for step, score in by_step.items():  # percent on a y axis from -3 to 103
                assert near(img, colour, row_of(box, 100 * score, -3, 103), col_of(box, step, x_low, x_high))
        row, col = round(row_of(box, 100 * baseline[group], -3, 103)), round(col_of(box, 0, x_low, x_high))
        assert grey[row - 2 : row + 3, left:right].any(0).mean() > 0.4, group  # the base model: dashed
        assert grey[top:bottom, col - 2 : col + 3].any(1).mean() > 0.3, group  # the start: dotted
    with pytest.raises(ValueError, match="no curves"):
        plots.plot_niah_curves({"seen": {}}, tmp_path / "empty.png")


def test_pattern_shares_stack_each_layers_shares(tmp_path):
    patterns = {
        1: {"constant": 0.2, "monotonic": 0.05, "hybrid": 0.75},
        "all": {"constant": 0.5, "monotonic": 0.3, "hybrid": 0.2},
    }
    img = rgb(plots.plot_pattern_shares(patterns, tmp_path / "patterns.png"))
    (box,) = axes_boxes(img)
    top, bottom, left, right = box
    colours = {"constant": "#4C72B0", "monotonic": "#DD8452", "hybrid": "#8C8C8C"}
    bars = runs(matches(img[bottom - 3, left:right], colours["constant"]))
    assert len(bars) == len(patterns)
    for (s, e), shares in zip(bars, patterns.values()):
        col = left + s + (e - s) // 5  # beside the centred labels
        below = bottom
        for pattern in ("constant", "monotonic", "hybrid"):  # stacked from the bottom, on 0..100 %
            rows = np.flatnonzero(matches(img[top:bottom, col], colours[pattern])) + top
            assert abs((rows.max() - rows.min() + 1) - shares[pattern] * (bottom - top)) <= 3, pattern
            assert abs(rows.max() + 1 - below) <= 2, pattern
            below = rows.min()


def test_span_heatmap_colours_each_cell_by_its_span(tmp_path):
    spans = {1: torch.tensor([0.0, 1.0, 2.0, 3.0]), 2: torch.tensor([7.0, 6.0, 5.0, 4.0])}
    img = rgb(plots.plot_span_heatmap(spans, tmp_path / "heatmap.png"))
    box = max(axes_boxes(img), key=lambda b: b[3] - b[2])  # the map, not its colour bar
    top, bottom, left, right = box
    viridis = matplotlib.colormaps["viridis"]
    for i, layer in enumerate(spans):
        for h, span in enumerate(spans[layer].tolist()):
            row = top + (i + 0.8) / 2 * (bottom - top)  # inside the cell, beside its centred value
            col = left + (h + 0.8) / 4 * (right - left)
            expected = np.array(
                viridis(span / 7)[:3]
            )  # the colour scale runs from the smallest span to the largest
            assert np.abs(img[round(row), round(col)] - expected).max() < 0.02, (layer, h)


def test_spans_by_length_against_ropes(tmp_path):
    # layer 1: span 4 at every length; layer 2: T / 2 (one step up per doubling, like RoPE's T - 1)
    spans = {n: {1: torch.full((4,), 4.0), 2: torch.full((4,), n / 2)} for n in (16, 32, 64)}
    img = rgb(plots.plot_spans_by_length(spans, tmp_path / "spans.png"))
    (box,) = axes_boxes(img)
    columns = xticks(img, box)
    assert len(columns) == 3
    flat = [height_of(img, box, "C0", c) for c in columns]
    rising = [height_of(img, box, "C1", c) for c in columns]
    step = rising[0] - rising[1]  # a doubling on the log y axis
    assert step > 20 and abs(rising[1] - rising[2] - step) <= 2
    assert max(flat) - min(flat) <= 2 and abs(flat[0] - rising[0] - step) <= 2  # 4 is half of 8
    for col, n, up in zip(columns, (16, 32, 64), rising):  # RoPE's T - 1, log-scaled from the T / 2 line
        assert near(img, "black", up - step * math.log2((n - 1) / (n / 2)), col, radius=4), n


def test_attention_mass_per_layer_and_model_with_repo_layers_shaded(tmp_path):
    repo = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).T * torch.tensor([[1.0, 2.0, 3.0]]) / 100  # [L=4, groups]
    rope = torch.tensor([[4.5, 1.5, 2.5, 0.5]]).T * torch.tensor([[1.0, 2.0, 3.0]]) / 100
    masses = {"RePo": AttentionMass(repo.double(), (1, 2, 3)), "RoPE": AttentionMass(rope.double(), ())}
    img = rgb(plots.plot_attention_mass(masses, tmp_path / "mass.png"))
    boxes = axes_boxes(img)
    assert len(boxes) == 3  # needle, query, other
    for g, box in enumerate(boxes[:2]):  # (the last panel holds the legend)
        columns = xticks(img, box)
        assert len(columns) == 4
        values = [100 * v for mass in (repo, rope) for v in mass[:, g].tolist()]
        rows = [height_of(img, box, colour, c) for colour in ("C0", "C1") for c in columns]
        slope, residual = affine_residual(values, rows)  # both models on the panel's one y axis
        assert slope < 0 and residual <= 2, (g, residual)
        top, bottom, _, _ = box
        for layer, col in enumerate(columns):
            between = col + (columns[1] - columns[0]) / 4  # inside the layer's band, off its grid line
            shade = np.median(img[top + 3 : bottom - 2, round(between)], axis=0)
            assert np.allclose(shade, 0.92 if layer in (1, 2, 3) else 1.0, atol=0.02), (g, layer)


def test_positions_one_point_per_token(tmp_path):
    z = torch.tensor([float((i - 10) ** 2) / 8 for i in range(32)])  # a parabola: down, then up
    tokens = ["The", " code", " of", " $x", "\n", " ", "is", " 5"] * 4
    img = rgb(plots.plot_positions(z, tokens, tmp_path / "new" / "positions.png"))
    (box,) = axes_boxes(img)
    columns = xticks(img, box)
    assert len(columns) == 32  # a label per token
    for i, col in enumerate(columns):
        assert math.isclose(col, col_of(box, i, -0.5, 31.5), abs_tol=2)  # the x axis is the token index
    slope, residual = affine_residual(z.tolist(), [height_of(img, box, "C0", c) for c in columns])
    assert slope < 0 and residual <= 2
    # A long text: labels are thinned out (every 11th of 1000 tokens), not dropped.
    img = rgb(plots.plot_positions(torch.randn(1000), ["tok"] * 1000, tmp_path / "long.png"))
    (box,) = axes_boxes(img)
    assert len(xticks(img, box)) == len(range(0, 1000, 11))


def test_learned_shares_draw_each_arm_s_share_and_wilson_interval_top_to_bottom(tmp_path):
    from olmo_repo.eval.intervals import wilson_interval

    learned = {"RePo": (3, 4), "NoPE": (0, 4)}
    img = rgb(plots.plot_learned_shares(learned, tmp_path / "learned.png"))
    (box,) = axes_boxes(img)
    rows = yticks(img, box)
    assert len(rows) == 2 and rows[0] < rows[1]  # the first arm on top
    for row, (k, n) in zip(rows, learned.values()):
        low, high = wilson_interval(k / n, n)
        for share in (k / n, low, high):  # the point and both ends of its interval
            assert near(img, "C0", row, col_of(box, 100 * share, -2, 112)), (k, n, share)
    assert not near(img, "C0", rows[1], col_of(box, 75, -2, 112))
    plots.plot_learned_shares({"RePo": (0, 3), "RoPE": (10, 10)}, tmp_path / "edges.png")  # bars of length 0
    # the study's labels and title: nothing runs off the figure (a glyph cut at an edge leaves ink on it)
    study = {"RePo, index blend over the first fifth": (4, 5), "RePo, f_phi's last layer 0 at init": (2, 5)}
    img = rgb(plots.plot_learned_shares(study, tmp_path / "study.png",
                                        title="from scratch: models that learned the recall (75 models)"))  # fmt: skip
    for edge in (img[0], img[-1], img[:, 0], img[:, -1]):
        assert (edge > 0.9).all()
    with pytest.raises(ValueError, match="no learned shares"):
        plots.plot_learned_shares({"RePo": (3, 2)}, tmp_path / "x.png")


def test_loss_panels_draw_each_group_s_runs_marked_or_not_on_a_log_axis(tmp_path):
    curves = {"RePo": {"seed 0": {100: 1.0, 200: 0.01}, "seed 1": {100: 1.0, 200: 1.0}},
              "RoPE": {"seed 0": {100: 0.1, 200: 0.01}}}  # fmt: skip
    img = rgb(plots.plot_loss_panels(curves, tmp_path / "panels.png", marked={("RePo", "seed 0"), ("RoPE", "seed 0")},
                                     reference=(1.39, "guess")))  # fmt: skip
    left, right = axes_boxes(img)  # a panel per group, side by side
    # RePo: the learned seed (C0) falls from 1 to 0.01 and the other (C1) stays at 1: at the last step C0 is far
    # below C1 (a log axis shared by both panels); RoPE's only run is marked
    top, bottom, x0, x1 = left
    end = round(x1 - 0.05 / 1.1 * (x1 - x0)) - 3  # the last step, inside matplotlib's margin
    column = img[top:bottom, end - 2 : end + 3]
    # thin lines are antialiased: a looser tolerance, still far from the other colour
    c0, c1 = (np.flatnonzero(matches(column, colour, tol=0.3).any(1)) for colour in ("C0", "C1"))
    assert len(c0) and len(c1) and c0.min() > c1.max() + 100  # rows grow downwards
    top, bottom, x0, x1 = right
    assert matches(img[top:bottom, x0:x1], "C0").any() and not matches(img[top:bottom, x0:x1], "C1").any()
    with pytest.raises(ValueError, match="no loss curves"):
        plots.plot_loss_panels({"RePo": {"seed 0": {}}}, tmp_path / "x.png")


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
    img = rgb(out)
    (box,) = axes_boxes(img)
    assert len(xticks(img, box)) == len(TEXT)  # a point and a label per token (one byte each)
    assert f"wrote {out}" in capsys.readouterr().out

    before = out.read_bytes()
    assert plot_positions_main(args) == 1  # an existing file is the user's: replaced only with --force
    assert "exists; pass --force" in capsys.readouterr().err and out.read_bytes() == before
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT * 3, encoding="utf-8")
    args = [str(ckpt), "--text-file", str(text_file), "--max-tokens", "64", "--out", str(out), "--force"]
    assert plot_positions_main(args) == 0

    # With the positions replaced as an evaluation replaces them, the plot shows what the layer rotates by.
    indexed = tmp_path / "index.png"
    assert (
        plot_positions_main([str(ckpt), "--text", TEXT, "--positions", "index", "--out", str(indexed)]) == 0
    )
    img = rgb(indexed)
    (box,) = axes_boxes(img)
    heights = [height_of(img, box, "C0", c) for c in xticks(img, box)]
    slope, residual = affine_residual(list(range(len(TEXT))), heights)
    assert slope < 0 and residual <= 2  # the token index: a straight rising line (image rows grow downwards)

    for bad, message in [
        (["--layer", "0"], "layer 0 is not a RePo layer of .*; RePo layers: \\[1, 2, 3\\]"),
        (["--head", "4"], "head 4 is out of range: the model has 4 key/value heads"),
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
