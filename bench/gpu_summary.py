"""The GPU run's record, from what `bench/gpu_check.sh` left in its folder: one dated JSON and the table that
bench/RESULTS.md takes, written here, not retyped; the run's targets each met or missed (and what holds a missed
one), or not measured where a part did not finish.

    python3 bench/gpu_summary.py gpu-out      # gpu_check.sh runs it last; rerun it on a run cut short

Writes gpu-out/gpu-run-<date>.json and gpu-out/results-table.md, and prints the table and the targets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path

from bench_check import TARGET_S as CHECK_TARGET_S
from bench_saved import ALLOWANCE
from measure import target_rows

PYTEST_SUMMARY = re.compile(r"=*\s*((?:\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed)(?:, )?)+)")


def _json(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _tests(folder: Path, log: str) -> dict | None:
    """A pytest log's last summary line, as {passed: n, failed: n, ...}, or None without one."""
    path = folder / log
    found = PYTEST_SUMMARY.findall(path.read_text()) if path.is_file() else []
    if not found:
        return None
    return {
        kind.rstrip("s") if kind == "errors" else kind: int(n)
        for n, kind in re.findall(r"(\d+) (\w+)", found[-1])
    }


def _row(part: str, what: str, measured: str, target: str, met: bool | None, held_by: str = "") -> dict:
    return {
        "part": part,
        "what": what,
        "measured": measured,
        "target": target,
        "met": met,
        "held_by": held_by,
    }


def tests_rows(folder: Path) -> list[dict]:
    """The device's kernel checks and the GPU training tests of both trainers: every test passed, none skipped."""
    rows = []
    for part, log in (
        ("kernels", "kernels.log"),
        ("ai2-olmo training", "tests.log"),
        ("OLMo-core training", "tests-core.log"),
    ):
        counts = _tests(folder, log)
        if counts is None:
            rows.append(_row(part, "tests", "not run", "all pass", None))
            continue
        measured = ", ".join(f"{n} {kind}" for kind, n in counts.items())
        met = counts.get("passed", 0) > 0 and not (counts.keys() & {"failed", "error", "skipped"})
        rows.append(_row(part, "tests", measured, "all pass, none skipped", met, "" if met else f"see {log}"))
    return rows


def check_rows(folder: Path) -> list[dict]:
    """The check before a kernel variant runs: its cost per specialisation beside the compile."""
    cost = _json(folder, "check-cost.json")
    if cost is None:
        return [_row("check", "cost per specialisation", "not run", f"< {CHECK_TARGET_S * 1e3:.0f} ms", None)]
    name, worst = max(cost["specialisations"].items(), key=lambda kv: kv[1]["check_s"])
    met = worst["check_s"] < CHECK_TARGET_S
    measured = f"{worst['check_s'] * 1e3:.1f} ms at most ({cost['device']})"
    return [
        _row(
            "check",
            "cost per specialisation",
            measured,
            f"< {CHECK_TARGET_S * 1e3:.0f} ms",
            met,
            "" if met else name,
        )
    ]


def saved_rows(folder: Path) -> list[dict]:
    """Bytes per token per layer a RePo layer keeps beyond RoPE's, on the kernel path, beside the allowance."""
    saved = _json(folder, "saved.json")
    if saved is None:
        return [_row("memory", "saved bytes per token per layer", "not run", f"<= {ALLOWANCE:,}", None)]
    rows = []
    for name, r in saved["bytes_per_token"].items():
        met = r["extra"] <= ALLOWANCE
        held = f"f_phi {r['f_phi']:,.0f}, q, k and positions {r['rest']:,.0f} (device-only)"
        rows.append(_row("memory", f"saved bytes per token per layer, {name}", f"{r['extra']:,.0f}",
                         f"<= {ALLOWANCE:,}", met, "" if met else held))  # fmt: skip
    return rows


def ratio_rows(folder: Path) -> list[dict]:
    """RePo/RoPE step, peak memory and decode of both trainers at the 1B shape (bench_repo.py, bench_core.py)."""
    rows = []
    found = [
        p.name
        for p in sorted(folder.glob("bench-*.json"))
        if p.name not in ("bench-core.json", "bench-vllm-gpu.json")
    ]
    if not found:
        rows.append(_row("ai2-olmo", "step, memory, decode", "not run", "issue 49's", None))
    for log in found:
        for size, result in _json(folder, log).items():
            held = result.get("held_by", {})
            rows += _target_rows(f"ai2-olmo {size}", result["ratios_vs_rope"]["repo"], result["shares"], held)
    core = _json(folder, "bench-core.json")
    if core is None:
        rows.append(_row("OLMo-core", "step, memory, decode", "not run", "issue 49's", None))
    for repo in ("repo", "repo-gqa") if core else ():
        rows += _target_rows(
            f"OLMo-core {core['size']} {repo}", core["ratios"][repo], core["shares"][repo], {}
        )
    return rows


def _target_rows(part: str, ratios: dict, shares: dict, held_by: dict) -> list[dict]:
    """`measure.target_rows` as rows, with what holds a missed one where the benchmark said."""
    return [
        _row(
            part,
            t["what"],
            f"{t['ratio']:.4f}",
            f"<= {t['target']:.4f}",
            t["met"],
            "" if t["met"] else held_by.get(t["what"], ""),
        )  # fmt: skip
        for t in target_rows(ratios, shares)
    ]


def table(rows: list[dict]) -> str:
    """The rows as the markdown table that bench/RESULTS.md takes."""
    lines = ["| part | what | measured | target | met |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        met = "not measured" if r["met"] is None else ("met" if r["met"] else "**MISSED**")
        lines.append(f"| {r['part']} | {r['what']} | {r['measured']} | {r['target']} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="what gpu_check.sh wrote (its OUT, default gpu-out)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder}: not a folder")
    rows = (
        tests_rows(args.folder) + check_rows(args.folder) + saved_rows(args.folder) + ratio_rows(args.folder)
    )
    versions = args.folder / "versions.log"
    date = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "date": date.isoformat(timespec="minutes"),
        "versions": versions.read_text().strip() if versions.is_file() else None,
        "rows": rows,
        "vllm": _json(args.folder, "bench-vllm-gpu.json"),
    }
    (args.folder / f"gpu-run-{date:%Y-%m-%d}.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.folder / "results-table.md").write_text(table(rows) + "\n")
    print(table(rows))
    print(f"== the run's targets ({date:%Y-%m-%d %H:%M} UTC)")
    for r in rows:
        verdict = "not measured" if r["met"] is None else ("met" if r["met"] else "MISSED")
        print(f"  {verdict:<13}{r['part']}: {r['what']} {r['measured']} (target {r['target']})")
        if r["held_by"]:
            print(f"    held by: {r['held_by']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
