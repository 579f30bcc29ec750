"""The suite's real model, SmolLM2-135M-Instruct (Q4_1 dequantised: `olmo_repo.smollm2`), built once per
test session wherever a session needs it: the main session (tests/test_smollm2.py), the OLMo-core session and the
vLLM session (their conftests import the fixture `smollm2_dir`). Each session builds it once (~10 s), its xdist
workers sharing the one folder (`suite.built_once`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmo_repo.smollm2 import make_smollm2

from .suite import built_once

__all__ = ["build_smollm2", "smollm2_dir"]


def build_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory scripts/smollm2.py writes, built once for the whole run (read it; copy it to change it)."""
    return built_once(tmp_path_factory, "smollm2", lambda folder: make_smollm2(folder, progress=False))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a stock `llama` HF directory (`build_smollm2`)."""
    return build_smollm2(tmp_path_factory)
