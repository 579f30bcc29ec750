"""Reading a plot back from its PNG: the axes (their black frames), their ticks, and where a colour is drawn.

The checks in the tests map data to pixels from what a reader of the picture sees: an axis with fixed limits
maps linearly between the frame's edges; ticks set at data values mark those values' columns; an axis with
automatic limits is checked through ratios (a line's points must fit one affine map of their values).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np

Box = tuple[int, int, int, int]  # top, bottom, left, right: rows and columns of the frame's lines


def rgb(path: str | Path) -> np.ndarray:
    """The PNG's pixels [height, width, 3] in [0, 1]."""
    return matplotlib.image.imread(path)[..., :3]


def runs(flags: np.ndarray, min_len: int = 1) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[0], flags.astype(int), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(s, e) for s, e in zip(starts, ends) if e - s >= min_len]


def axes_boxes(img: np.ndarray, min_len: int = 60) -> list[Box]:
    """The frames of the axes (black lines around a rectangle at least `min_len` wide), left to right."""
    dark = img.max(-1) < 0.2
    boxes: list[Box] = []
    for r in range(dark.shape[0] - 21):
        for s, e in runs(dark[r], min_len):
            sides = [c for c in range(s, e) if dark[r + 1 : r + 21, c].all()]  # the vertical lines
            if not sides or any(abs(t - r) <= 3 and abs(left - sides[0]) <= 3 for t, _, left, _ in boxes):
                continue
            left, right = sides[0], sides[-1]
            rows = [b for b in range(r + 20, dark.shape[0]) if dark[b, left + 5 : right - 5].mean() > 0.9]
            if rows:
                boxes.append((r, rows[-1], left, right))
    return sorted(boxes, key=lambda b: (b[2], b[0]))


def _centres(flags: np.ndarray, origin: int) -> list[float]:
    return [origin + (s + e - 1) / 2 for s, e in runs(flags)]


def xticks(img: np.ndarray, box: Box, offset: int = 5) -> list[float]:
    """Columns of the major tick marks below the frame (minor ticks are shorter than `offset` pixels)."""
    top, bottom, left, right = box
    return _centres(img[bottom + offset, left - 3 : right + 4].max(-1) < 0.4, left - 3)


def yticks(img: np.ndarray, box: Box, offset: int = 5) -> list[float]:
    """Rows of the major tick marks left of the frame."""
    top, bottom, left, right = box
    return _centres(img[top - 3 : bottom + 4, left - offset].max(-1) < 0.4, top - 3)


def matches(img: np.ndarray, colour: str, tol: float = 0.08) -> np.ndarray:
    """[height, width] True where the pixel is `colour` (a matplotlib colour) within `tol` per channel."""
    return (np.abs(img - np.array(matplotlib.colors.to_rgb(colour))) <= tol).all(-1)


def near(img: np.ndarray, colour: str, row: float, col: float, radius: int = 3) -> bool:
    """Whether `colour` is drawn within `radius` pixels of (row, col)."""
    r, c = round(row), round(col)
    return bool(matches(img[r - radius : r + radius + 1, c - radius : c + radius + 1], colour).any())


def rows_of(img: np.ndarray, box: Box, colour: str, col: float, width: int = 2) -> list[int]:
    """The rows inside the frame where `colour` fills columns `col - width` to `col + width`: a marker's rows
    (a line crossing the column steeply is narrower), or a flat line's."""
    top, bottom, left, right = box
    c = round(col)
    hits = matches(img[top + 3 : bottom - 2, c - width : c + width + 1], colour).all(-1)
    return [top + 3 + int(i) for i in np.flatnonzero(hits)]


def height_of(img: np.ndarray, box: Box, colour: str, col: float) -> float:
    """The middle row of the `colour` marker in column `col`."""
    rows = rows_of(img, box, colour, col)
    assert rows, f"{colour} is not drawn in column {col}"
    return float(np.median(rows))


def affine_residual(values: list[float], rows: list[float]) -> tuple[float, float]:
    """(slope, largest residual in pixels) of the least-squares line rows ~ values."""
    slope, intercept = np.polyfit(values, rows, 1)
    return float(slope), float(np.abs(np.polyval([slope, intercept], values) - rows).max())


def row_of(box: Box, value: float, low: float, high: float) -> float:
    """The row of `value` on a linear y axis whose limits are (low, high)."""
    top, bottom, _, _ = box
    return bottom - (value - low) / (high - low) * (bottom - top)


def col_of(box: Box, value: float, low: float, high: float) -> float:
    """The column of `value` on a linear x axis whose limits are (low, high)."""
    _, _, left, right = box
    return left + (value - low) / (high - low) * (right - left)
