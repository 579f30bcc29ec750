"""What the benchmarks share (torch only: bench_repo.py in .venv, bench_core.py in .venv-core, bench_vllm.py in
.venv-vllm): timing and memory of one step, the interleaved rounds that time each trainer's models side by side
(`interleaved_rounds`: the trainer gives each model's step and decode), and their `--json` argument, checked before
anything runs."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from tqdm import tqdm

__all__ = ["interleaved_rounds", "json_file", "peak_step_memory", "sync", "timed"]


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


def interleaved_rounds(
    steps: Mapping[str, Callable[[], None]],
    decodes: Mapping[str, Callable[[], float]],
    reps: int,
    device: str,
    rng: random.Random,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """`reps` rounds, each timing one training step of every model (`steps`), then one decode of every model
    (`decodes`: each returns its seconds per generated token), each time in a new shuffled order, so that the
    machine's drift falls on every model alike and ratios are taken within a round. Returns ({name: step seconds
    per round}, {name: decode seconds per token per round})."""
    step_s: dict[str, list[float]] = {name: [] for name in steps}
    decode_s: dict[str, list[float]] = {name: [] for name in decodes}
    order = list(steps)
    for _ in tqdm(range(reps), desc=f"steps and decodes, {len(order)} models", unit="round"):
        rng.shuffle(order)
        for name in order:
            step_s[name].append(timed(steps[name], device))
        rng.shuffle(order)
        for name in order:
            decode_s[name].append(decodes[name]())
    return step_s, decode_s
