"""What the check before a RePo kernel variant first runs costs (`olmo_repo.kernels.select`), at the 1B's
specialisations: training (4 x 4096 tokens, bf16, with the backward) and a decode step (one token, no autograd),
multi-head and grouped-query (4 key/value heads), for the rotation and f_phi's tail.

    python3 bench/bench_check.py                                  # on a GPU
    TRITON_INTERPRET=1 .venv/bin/python bench/bench_check.py      # on CPU, the kernels under Triton's interpreter

Each specialisation is checked once first (which compiles its variants on a GPU: the compile the real call pays
anyway, as it then finds them compiled), then `--reps` more times after `select.forget()`: their median is the
check's own cost beside the compile (target: under 50 ms per specialisation). `torch ops` is the part of it spent in
torch's operators (the float64 reference, the bounds, the inputs), from torch's profiler; under the interpreter the
rest is the kernels running in numpy, which says nothing of a GPU. `per call` is what a layer pays at every call once
the verdict is known (`ready`: the specialisation's key and a dictionary lookup), the only per-step cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from measure import json_file
from torch.profiler import ProfilerActivity, profile

from olmo_repo.kernels import f_phi_ready, rotation_ready, select

TARGET_S = 0.05
"""Issue 59's target for the check's own cost per specialisation, beside the compile."""
HEADS, HEAD_DIM, HIDDEN = 16, 128, 256  # the 1B: 16 query heads of 128, f_phi's hidden width d_model / 8


def specialisations(device: str) -> dict[str, Callable[[], bool]]:
    """{name: a `ready` call at that specialisation} on inputs of the real call's shapes (their values unread)."""
    calls = {}
    for n_kv in (HEADS, 4):
        for phase, batch, tokens, grad in (("training", 4, 4096, True), ("decode", 1, 1, False)):
            q = torch.empty(batch, HEADS, tokens, HEAD_DIM, dtype=torch.bfloat16, device=device)
            k = torch.empty(batch, n_kv, tokens, HEAD_DIM, dtype=torch.bfloat16, device=device)
            z = torch.empty(batch, tokens, n_kv, device=device).transpose(1, 2)  # f_phi's [B, H_kv, T]
            final_map = torch.empty(n_kv, HIDDEN, dtype=torch.bfloat16, device=device)
            for t in (q, k, z):
                t.requires_grad_(grad)
            name = f"{phase} {'MHA' if n_kv == HEADS else 'GQA'}"
            calls[f"rotation, {name}"] = lambda q=q, k=k, z=z, g=grad: rotation_ready(q, k, z, False, g)
            calls[f"f_phi tail, {name}"] = lambda m=final_map, n=batch * tokens, g=grad: f_phi_ready(n, m, g)
    return calls


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(ready: Callable[[], bool], reps: int, device: str) -> dict[str, float]:
    """Seconds: the first check (compiles), the median of `reps` more (each after `select.forget()`), the torch ops
    within one of them, and one call once the verdict is known."""
    select.forget()
    start = time.perf_counter()
    assert ready(), "the check failed here: see its warning"
    sync(device)
    first = time.perf_counter() - start
    times = []
    for _ in range(reps):
        select.forget()
        start = time.perf_counter()
        ready()
        sync(device)
        times.append(time.perf_counter() - start)
    select.forget()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ready()
    torch_ops = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    start = time.perf_counter()
    for _ in range(1000):
        ready()
    return {
        "first_s": first,
        "check_s": statistics.median(times),
        "torch_ops_s": torch_ops,
        "per_call_s": (time.perf_counter() - start) / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="checks timed per specialisation (default 5)")
    parser.add_argument(
        "--json", type=json_file, default=None, help="also write the figures to this JSON file"
    )
    parser.add_argument(
        "--only", default="", help="only the specialisations whose names hold this (e.g. decode)"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu, Triton's interpreter"
    print(f"the check's cost per specialisation ({where}; torch {torch.__version__}):")
    print(f"  {'specialisation':<26}{'first (compiles)':>18}{'check':>12}{'torch ops':>12}{'per call':>12}")
    results = {}
    for name, ready in specialisations(device).items():
        if args.only not in name:
            continue
        r = results[name] = measure(ready, args.reps, device)
        print(
            f"  {name:<26}{r['first_s'] * 1e3:>15.1f} ms{r['check_s'] * 1e3:>9.1f} ms"
            f"{r['torch_ops_s'] * 1e3:>9.1f} ms{r['per_call_s'] * 1e6:>9.1f} us"
        )
    worst = max(r["check_s"] for r in results.values())
    print(
        f"the check's cost beside the compile: at most {worst * 1e3:.1f} ms per specialisation "
        f"(target: under {TARGET_S * 1e3:.0f} ms)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "torch": torch.__version__, "specialisations": results}, f, indent=2)


if __name__ == "__main__":
    main()
