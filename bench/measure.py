"""What the benchmarks share (torch only: bench_repo.py in .venv, bench_core.py in .venv-core, bench_vllm.py in
.venv-vllm): timing and memory of one step, and their `--json` argument, checked before anything runs."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["json_file", "peak_step_memory", "sync", "timed"]


def json_file(path: str) -> str:
    """argparse `type` of `--json PATH`: a file in an existing folder (checked before minutes of measuring)."""
    if Path(path).is_dir() or not Path(path).resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: not a file in an existing folder")
    return path


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], None], device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def peak_step_memory(step: Callable[[], None], model: torch.nn.Module, device: str) -> int:
    """Bytes: the model's weights plus the highest allocation above them during one training step."""
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        return resident + torch.cuda.max_memory_allocated() - base
    # CPU: torch keeps no allocator statistics, so replay the profiler's allocation events.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return resident + peak
