"""What the benchmarks share (torch only: bench_repo.py in .venv, bench_core.py in .venv-core, bench_vllm.py in
.venv-vllm): timing and memory of one step, the interleaved rounds that time each trainer's models side by side
(`interleaved_rounds`: the trainer gives each model's step and decode), the profile of RePo's own ops
(`profile_difference`), issue 49's targets beside the measurements (`targets`), and the `--json` argument, checked
before anything runs."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from olmo_repo.modes import is_f_phi_param

__all__ = [
    "Profile",
    "f_phi_shares",
    "interleaved_rounds",
    "json_file",
    "micro_batch",
    "peak_step_memory",
    "profile_difference",
    "sync",
    "target_rows",
    "targets",
    "timed",
]

STEP_TARGET, DECODE_TARGET, MEMORY_SLACK = 1.02, 1.01, 0.003
"""Issue 49's targets at the 1B shape on one H200: RePo/RoPE step time in timed rounds, decode time per token, and
what peak memory may add beyond f_phi's share of the weights (`f_phi_shares`)."""


def json_file(path: str) -> str:
    """argparse `type` of `--json PATH`: a file in an existing folder (checked before minutes of measuring)."""
    if Path(path).is_dir() or not Path(path).resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: not a file in an existing folder")
    return path


def micro_batch(value: str) -> int:
    """argparse `type` of `--batch N`: sequences per step, at least 1."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value} sequences; give a whole number of at least 1")
    return int(value)


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


@dataclass
class Profile:
    """`profile_difference`'s result: its report, and the ops (with input shapes) only RePo runs, largest first,
    with their self time in ms and their share of the RoPE step."""

    text: str
    own: list[tuple[str, float, float]]


def profile_difference(step_of: Callable[[str], Callable[[], None]], device: str, top: int = 12) -> Profile:
    """Self time per (op, input shapes) of one training step, RePo minus RoPE: where the difference goes.
    `step_of(mode)` builds the model of `mode` ("rope", then "repo") and returns its training step; each model is
    let go before the next is built.

    Ops with shapes that only RePo runs (f_phi's matmuls and kernels, the rotation) are its own cost; differences in
    the ops both run (the big matmuls) are the machine's noise between two steps, which can be several percent.
    RoPE's rotation in the layers RePo replaces has the shapes of the RoPE layers that remain, so it is not
    subtracted here; bench_repo.py's pieces do that.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    per_op: dict[str, dict[str, float]] = {}
    for mode in ("rope", "repo"):
        step = step_of(mode)
        step()  # warm-up: allocator, kernels, compilation
        with profile(activities=activities, record_shapes=True) as prof:
            step()
            sync(device)
        per_op[mode] = {
            f"{e.key} {e.input_shapes}": getattr(e, attr) / 1e3
            for e in prof.key_averages(group_by_input_shape=True)
        }
        del step
    rope, repo = per_op["rope"], per_op["repo"]
    total = {m: sum(v.values()) for m, v in per_op.items()}
    own = sorted(
        ((k, v, v / total["rope"]) for k, v in repo.items() if k not in rope and v > 0), key=lambda r: -r[1]
    )
    gone = {k: v for k, v in rope.items() if k not in repo and v > 0}
    shared = sorted(((repo[k] - rope[k], k) for k in repo.keys() & rope.keys()), key=lambda r: -abs(r[0]))
    net = sum(v for _, v, _ in own) - sum(gone.values())
    lines = [
        f"profile, one step each: RoPE {total['rope']:.1f} ms, RePo {total['repo']:.1f} ms (self time summed)",
        f"ops and shapes only RePo runs: +{sum(v for _, v, _ in own):.1f} ms; only RoPE runs: "
        f"-{sum(gone.values()):.1f} ms; net {net:+.1f} ms = {net / total['rope'] * 100:+.2f}% of the RoPE step",
    ]
    lines += [f"  {v:+9.2f} ms {share * 100:+6.2f}%  {k}" for k, v, share in own[:top]]
    lines += [f"  {-v:+9.2f} ms          {k}" for k, v in sorted(gone.items(), key=lambda kv: -kv[1])[:top]]
    lines.append("largest differences in ops both run (noise between two steps):")
    lines += [f"  {d:+9.2f} ms  {k}" for d, k in shared[:3]]
    return Profile("\n".join(lines), own)


def f_phi_shares(repo: torch.nn.Module, rope: torch.nn.Module) -> dict[str, float]:
    """Issue 49's floor and memory target from f_phi's weights: the step's FLOPs floor, 1 + f_phi's weights over the
    RoPE model's non-embedding weights (6 N D); the memory target, 1 + f_phi's weights over all of the RoPE
    model's (weights, gradients and Adam's state grow by this share) + MEMORY_SLACK."""
    f_phi = sum(p.numel() for name, p in repo.named_parameters() if is_f_phi_param(name))
    weights = sum(p.numel() for p in rope.parameters())
    embedding = sum(m.weight.numel() for m in rope.modules() if isinstance(m, torch.nn.Embedding))
    return {
        "flops_floor": 1 + f_phi / (weights - embedding),
        "memory_target": 1 + f_phi / weights + MEMORY_SLACK,
    }


def target_rows(ratios: Mapping[str, float], shares: Mapping[str, float]) -> list[dict]:
    """Issue 49's targets beside the measured RePo/RoPE `ratios` (step: timed rounds; memory: peak; decode: per
    token): one {what, ratio, target, met, note} each."""
    limits = {
        "step": (STEP_TARGET, f"f_phi's FLOPs floor {shares['flops_floor']:.4f}"),
        "memory": (shares["memory_target"], f"1 + f_phi's share of the weights + {MEMORY_SLACK}"),
        "decode": (DECODE_TARGET, ""),
    }
    return [
        {"what": what, "ratio": ratios[what], "target": limit, "met": ratios[what] <= limit, "note": note}
        for what, (limit, note) in limits.items()
    ]


def targets(ratios: Mapping[str, float], shares: Mapping[str, float], held_by: Mapping[str, str]) -> str:
    """`target_rows` as text, each met or missed; where one is missed, `held_by[what]` says which op holds it
    (the benchmark's breakdown). The targets are the 1B's on one H200: other sizes and machines show where they
    stand."""
    lines = ["targets (issue 49, the 1B on one H200): RePo/RoPE"]
    for row in target_rows(ratios, shares):
        what, met = row["what"], row["met"]
        lines.append(
            f"  {what:<7}{row['ratio']:8.4f}  target <= {row['target']:.4f}  {'met' if met else 'MISSED':<7}"
            f"{row['note']}"
        )
        if not met and held_by.get(what):
            lines.append(f"    held by: {held_by[what]}")
    return "\n".join(lines)
