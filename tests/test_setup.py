"""The README's commands and the Makefile's install, as a new user runs them."""

from __future__ import annotations

import re
import shlex

import pytest
from olmo.exceptions import OLMoConfigurationError

from olmo_repo import RepoTrainConfig
from olmo_repo.train import preflight

from .conftest import ROOT
from .training import write_corpus


def _readme_commands() -> list[str]:
    """The shell commands of the README's indented blocks, continuation lines joined, comments dropped."""
    commands, current = [], ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if not line.startswith("    ") or line.strip().startswith("#"):
            continue
        current += line.strip().removesuffix("\\")
        if not line.endswith("\\"):
            commands.append(current.split("  #")[0].strip())
            current = ""
    return commands


def test_readme_commands_use_the_virtual_environment():
    tools = ("python", "python3", "torchrun", "pip", "lm_eval", "pytest", "ruff")
    bare = [c for c in _readme_commands() if c.split(" ")[0] in tools]
    assert not bare, f"run from .venv/bin/ (the package is installed there): {bare}"
    assert any(c.startswith(".venv/bin/torchrun --nproc_per_node=2") for c in _readme_commands())


def test_readme_two_process_examples_pass_preflight(tmp_path):
    commands = [c for c in _readme_commands() if c.startswith(".venv/bin/torchrun --nproc_per_node=2")]
    assert len(commands) >= 2  # DDP and FSDP
    data = write_corpus(tmp_path / "data")  # the README uses the demo's corpus
    for command in commands:
        config, *flags = shlex.split(command)[3:]  # after torchrun, --nproc_per_node=2, scripts/train.py
        overrides = [re.sub(r"^--data_prefix=.*", f"--data_prefix={data}", f) for f in flags]
        overrides = [o.removeprefix("--") for o in overrides + [f"--save_folder={tmp_path / 'run'}"]]
        preflight(RepoTrainConfig.load(ROOT / config, overrides), cuda=False, world_size=2)
    without = [o for o in overrides if not o.startswith("device_train_microbatch_size")]
    with pytest.raises(
        OLMoConfigurationError, match="pass --device_train_microbatch_size=N with N dividing 4"
    ):
        preflight(RepoTrainConfig.load(ROOT / config, without), cuda=False, world_size=2)
