"""The layering contracts of pyproject.toml (import-linter): a planted forbidden import breaks the contract it
should, and docs/architecture.md shows the contracts as they are."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from .conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def render(contracts: list[dict]) -> str:
    """The contracts as docs/architecture.md shows them: the layers top down, then each contract's rule."""
    layers = next(c for c in contracts if c["type"] == "layers")
    lines = ["```text", *layers["layers"], "```", ""]
    for contract in contracts:
        lines.append(f"- {contract['name']}.")
        if contract["type"] == "forbidden":
            sources, forbidden = (
                ", ".join(f"`{m}`" for m in contract[k]) for k in ("source_modules", "forbidden_modules")
            )
            verb = "imports" if len(contract["source_modules"]) == 1 else "import"
            lines.append(f"  {sources} {verb} none of {forbidden}, directly or not.")
    return "\n".join(lines) + "\n"


def test_the_architecture_page_shows_the_contracts():
    assert render(contracts()) in (ROOT / "docs/architecture.md").read_text()
    assert not any("ignore_imports" in contract for contract in contracts())


def _lint(package_root: Path) -> subprocess.CompletedProcess:
    """lint-imports with pyproject.toml's contracts on the copy of olmo_repo in `package_root`."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=package_root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    "module, planted, broken",
    [
        ("modes.py", "import torch", "The mode rule, the stage-1 fit rule"),
        ("rope.py", "import numpy", "The RePo layer needs torch only"),
        ("kernels/rotation.py", "import transformers", "RePo's Triton kernels need torch and Triton only"),
        ("eval/loading.py", "import olmo_repo.ai2olmo.train", "Each layer imports only the layers below it"),
        (
            "eval/loading.py",
            "import olmo_repo.ai2olmo.train",
            "Evaluation and the explorer reach models through the HF and vLLM interfaces only",
        ),
        ("explore/model.py", "import olmo.model", "Evaluation and the explorer reach models"),
        ("hf/modeling_repo_olmo2.py", "from . import formats", "The HF remote code"),
        ("hf/formats.py", "from ..vllm import model", "Each layer imports only the layers below it"),
        (
            "ai2olmo/train.py",
            "from ..experiments import stages",
            "Each layer imports only the layers below it",
        ),
        ("experiments/stages.py", "from .demo import demo", "The experiments (the demo, the SmolLM2 recipe"),
    ],
)
def test_a_planted_forbidden_import_breaks_its_contract(tmp_path, module, planted, broken):
    shutil.copytree(ROOT / "olmo_repo", tmp_path / "olmo_repo", ignore=shutil.ignore_patterns("__pycache__"))
    assert _lint(tmp_path).returncode == 0  # the copy as it is keeps every contract
    path = tmp_path / "olmo_repo" / module
    path.write_text(path.read_text() + f"\n{planted}\n")
    result = _lint(tmp_path)
    report = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)  # without its colours
    assert result.returncode != 0, report
    broken_names = [line for line in report.splitlines() if line.endswith(" BROKEN")]
    assert any(line.startswith(broken) for line in broken_names), report[-3000:]
    assert f"olmo_repo.{module.replace('/', '.').removesuffix('.py')} -> " in report  # the planted line named
