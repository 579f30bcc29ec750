"""How fast every script answers `--help`: the wall time of `python scripts/NAME.py --help`, as a user runs it.

    .venv/bin/python bench/bench_cli.py            # 5 runs per script, median and max in seconds
    .venv/bin/python bench/bench_cli.py --runs 10

`--help` and argument errors come before the heavy imports (torch, transformers, ai2-olmo, lm-eval), so each
should answer well under a second; the last line is `slowest: NAME SECONDS`. A script that fails prints its
error and the benchmark exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per script (default: 5)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    scripts = sorted((ROOT / "scripts").glob("*.py"))
    times: dict[str, list[float]] = {path.stem: [] for path in scripts}
    for _ in range(args.runs):  # interleaved: drift of a shared machine hits every script alike
        for path in scripts:
            start = time.perf_counter()
            result = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True)
            times[path.stem].append(time.perf_counter() - start)
            if result.returncode != 0:
                print(
                    f"{path.name} --help failed ({result.returncode}): {result.stderr.strip()}",
                    file=sys.stderr,
                )
                return 1
    print(f"{'script':<18}{'median s':>10}{'max s':>8}")
    for name, seconds in times.items():
        print(f"{name:<18}{statistics.median(seconds):>10.3f}{max(seconds):>8.3f}")
    slowest = max(times, key=lambda name: statistics.median(times[name]))
    print(f"slowest: {slowest} {statistics.median(times[slowest]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
