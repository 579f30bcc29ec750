"""The documented commands (README.md and docs/) and the Makefile's install, as a new user runs them."""

from __future__ import annotations

import re

from .training import ROOT, documented_commands


def test_documented_commands_use_the_virtual_environment():
    tools = ("python", "python3", "torchrun", "pip", "lm_eval", "pytest", "ruff", "mkdocs")
    commands = documented_commands()
    bare = [c for c in commands if c.split(" ")[0] in tools]
    assert not bare, f"run from .venv/bin/ (the package is installed there): {bare}"
    assert any(c.startswith(".venv/bin/python scripts/train.py --nproc-per-node=2") for c in commands)
    # Multi-process runs are started by the commands, which check the run once first (cli/launch.py).
    assert not [c for c in commands if "torchrun" in c.split(" ")[0]]
    assert "make demo" in commands and "make test" in commands  # the README's two set-up commands


def test_readme_links_point_at_files_of_the_repository():
    """The docs pages' links are checked by `mkdocs build --strict`; the README is not a page of the site."""
    links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the documentation"
    assert not [link for link in local if not (ROOT / link).exists()]


def test_the_long_tier_table_names_every_file_with_long_tests():
    """docs/setup.md's table of `make test-long` says what CI leaves out: its files are the ones marked `long`."""
    marked = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"pytest\.mark\.long\b", path.read_text())
    }
    text = (ROOT / "docs/setup.md").read_text()
    start = text.index("| `make test-long` |")
    table = text[start : text.index("\n\n", start)]  # the table ends at the first blank line
    rows = [row.split("|")[1] for row in table.splitlines()[2:] if row.startswith("|")]
    named = {file for row in rows for file in re.findall(r"`(tests/[\w/]+\.py)`", row)}
    assert marked == named
    assert (
        "TIER ?= not long" in (ROOT / "Makefile").read_text()
    )  # what `make test` runs; test-long sets TIER=long
