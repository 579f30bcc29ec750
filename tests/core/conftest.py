"""The OLMo-core 3 tests run in their own environment (`make test-core`: .venv-core, ai2-olmo-core 3.0.0, no
ai2-olmo). Where OLMo-core 3 is not installed (the project's .venv holds ai2-olmo's olmo-core 0.1.0) this folder is
not collected; run it with `--confcutdir tests/core` so that tests/conftest.py (the ai2-olmo side's fixtures) is
not loaded."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

import pytest

from ..real_models import smollm2_dir  # noqa: F401  (the session fixture of the real model)
from ..suite import register


def _olmo_core_major() -> int:
    try:
        return int(version("ai2-olmo-core").split(".")[0])
    except PackageNotFoundError:
        return 0


if _olmo_core_major() < 3:
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download (read once by huggingface_hub)


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # tests/suite.py's hooks, once per session
