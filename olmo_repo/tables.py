"""Markdown tables for analysis results (console and `report.md`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub Markdown table: the first column left-aligned, the others right-aligned (numbers)."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row needs {len(header)} cells (the header's)")
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
