"""Seconds per training step of the demo's tiny config in three process/thread layouts, on an idle machine and
beside one CPU-bound process, side by side in one run; prints the ratios.

    .venv/bin/python bench/bench_demo_layout.py [--steps 30] [--warmup 5]

Layouts: one process with torch's default threads (as many as cores), one process with one thread, and two
DDP processes of one thread each under torchrun (`olmo_repo.experiments.demo.PROCS`). The competitor is a Python busy
loop, the kind of second job a shared machine runs. `make demo` uses the layout whose loaded/idle ratio is
lowest at a comparable idle speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from olmo_repo.experiments.demo.corpus import BATCH

LAYOUTS = {
    "1 process, default threads": (1, None),
    "1 process, 1 thread": (1, 1),
    "2 processes x 1 thread (torchrun)": (2, 1),
}


def seconds_per_step(
    config: Path, data: Path, save: Path, procs: int, threads: int | None, steps: int, warmup: int
) -> float:
    """Wall seconds per step between step `warmup` and step `steps`, from when metrics.jsonl gains them."""
    launcher = [sys.executable, "-m"]
    if procs > 1:
        launcher += ["torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", "-m"]
    env = {**os.environ, "OLMo_NONINTERACTIVE": "1", "WANDB_MODE": "disabled"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        *launcher, "olmo_repo.cli.train", str(config), f"--save_folder={save}", f"--data_prefix={data}",
        f"--max_duration={steps}", f"--stop_at={steps}", "--evaluators=[]", "--eval_interval=100000",
        "--save_interval_unsharded=100000", "--no_pre_train_checkpoint=true", "--wandb=null",
        f"--device_train_microbatch_size={BATCH // procs}",
    ]  # fmt: skip
    seen: dict[int, float] = {}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        while proc.poll() is None:
            metrics = save / "metrics.jsonl"
            if metrics.is_file():
                for line in metrics.read_text().splitlines():
                    step = json.loads(line)["step"]
                    seen.setdefault(step, time.monotonic())
            time.sleep(0.05)
    if proc.returncode != 0 or warmup not in seen or steps not in seen:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode})")
    return (seen[steps] - seen[warmup]) / (steps - warmup)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30, help="steps per run (default: 30)")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the timing (default: 5)")
    args = parser.parse_args()

    from olmo_repo.experiments.demo import config_path
    from olmo_repo.experiments.demo.base import base_tokenizer
    from olmo_repo.experiments.demo.corpus import build_corpus

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "data")
        build_corpus(data, base_tokenizer(), {"stage1": args.steps * BATCH, "val": BATCH})
        results: dict[str, dict[str, float]] = {}
        for load in ("idle", "beside a busy loop"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "idle" else None
            try:
                for name, (procs, threads) in LAYOUTS.items():
                    save = Path(tmp, f"run-{len(results)}-{procs}-{threads}-{load[0]}")
                    s = seconds_per_step(config_path("stage1-rope"), data, save, procs, threads, args.steps,
                                         args.warmup)  # fmt: skip
                    results.setdefault(name, {})[load] = s
                    print(f"{name:36s} {load:20s} {s:.3f} s/step", flush=True)
            finally:
                if busy is not None:
                    busy.kill()
    print(f"\n{os.cpu_count()} CPUs. s/step (lower is better), and loaded / idle:")
    for name, by_load in results.items():
        idle, loaded = by_load["idle"], by_load["beside a busy loop"]
        print(f"  {name:36s} idle {idle:.3f}  loaded {loaded:.3f}  ratio {loaded / idle:.2f}")


if __name__ == "__main__":
    main()
