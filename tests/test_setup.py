"""The README's commands and the Makefile's install, as a new user runs them."""

from __future__ import annotations

from .training import readme_commands


def test_readme_commands_use_the_virtual_environment():
    tools = ("python", "python3", "torchrun", "pip", "lm_eval", "pytest", "ruff")
    bare = [c for c in readme_commands() if c.split(" ")[0] in tools]
    assert not bare, f"run from .venv/bin/ (the package is installed there): {bare}"
    assert any(c.startswith(".venv/bin/torchrun --nproc_per_node=2") for c in readme_commands())
