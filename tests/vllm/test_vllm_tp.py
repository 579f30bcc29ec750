"""vLLM with two tensor-parallel CPU ranks (a process per rank, so it runs alone under xdist) against HF."""

from __future__ import annotations

import pytest

from .engines import SWITCHES, check_against_hf


@pytest.mark.slow
@pytest.mark.parametrize("name", ["repo", pytest.param("gqa", marks=pytest.mark.long)])
def test_tensor_parallel_2_ranks_equals_hf(checkpoints, hf_reference, make_llm, monkeypatch, name):
    """Two real CPU ranks (vLLM's multiprocess executor, a process per rank): each rank holds half the heads
    (gqa: one key/value head and its two query heads), loads its rows of final_map and predicts its key/value
    heads' positions; the q/k norms gather over both ranks."""
    # vLLM binds each rank's threads to a NUMA node by default and refuses two ranks on one node: a core each.
    import os

    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"two CPU ranks need two cores; this process may use {cpus}"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    path, _ = checkpoints[name]
    llm = make_llm(path, tensor_parallel_size=2, **SWITCHES["cache+chunks"])
    check_against_hf(llm, name, checkpoints, hf_reference, prefix_caching=True)
