"""`scripts/eval.py`: evaluate MODEL (an HF directory or an OLMo checkpoint of this project) on RULER NIAH at
several lengths, or on the paper's suite, with YaRN past the training length.

Every input is checked before any heavy work (the arguments and the model's files before torch, transformers
or lm-eval load; then that every task can build its prompts at each length with the model's tokenizer); a bad
one stops the run with one line and nothing written.
Outputs in `--out`: `results.json`, `results.md` (the table) and, for NIAH, `samples.jsonl` (every sample's
answers, output and score). `--overwrite` replaces those files in an existing, non-empty `--out`; nothing
else there is touched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import RepoError
from ..eval.variants import DTYPE_NAMES, ESSAYS, MAX_NEW_TOKENS, VARIANTS, parse_yarn
from ..integrity import require_model_dir
from . import fail

# The parser and the checks of the arguments and the model's files use only these light modules: `--help`,
# a bad flag and a missing model answer before torch, transformers and lm-eval load (seconds).
OUTPUTS = ("results.json", "results.md", "samples.jsonl")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval.py",
        description="Evaluate a model on RULER NIAH (offline) or on the paper's suite through lm-eval.",
        epilog="Example: scripts/eval.py hf/repo-1b --tasks niah --lengths 4096,8192 --samples 20 --out results/x",
    )
    p.add_argument(
        "model", metavar="MODEL", help="an HF directory or an OLMo checkpoint directory of this project"
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--tasks",
        default="niah",
        help="'niah' (the eight RULER NIAH variants the paper reports) or a comma-separated list of variants "
        f"({', '.join(VARIANTS)}); default: niah",
    )
    what.add_argument(
        "--suite",
        choices=["paper"],
        help="'paper': the paper's suite through lm-eval (NIAH, HybridQA and the short-context tasks at the first "
        "length; RULER and LongBench at every length); without a network only the offline tasks run",
    )
    p.add_argument(
        "--lengths",
        help="comma-separated context lengths in the model's tokens (prompt + 128 generated tokens); "
        "default: 4096 for --tasks, 4096,8192,16384 for --suite",
    )
    p.add_argument("--samples", type=int, help="samples per NIAH variant and length (default: RULER's 500); "
                   "with --suite also lm-eval's limit per task")  # fmt: skip
    p.add_argument("--seed", type=int, default=42, help="seed of the NIAH prompts (default: 42, RULER's)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generation batch (default: 8)")
    p.add_argument(
        "--yarn",
        default="auto",
        help="YaRN past the training length: 'auto' (factor = length / training length, the paper's), 'off', "
        "or a factor such as 2 (default: auto)",
    )
    p.add_argument(
        "--essays",
        choices=ESSAYS,
        default="offline",
        help="essay haystack: 'offline' (generated prose shipped in the package) or 'paul_graham' (RULER's "
        "essays, downloaded by lm-eval: needs a network); default: offline",
    )
    p.add_argument("--dtype", choices=[*DTYPE_NAMES, "auto"], default="auto",
                   help="weights dtype (default auto: bfloat16 on CUDA, float32 on CPU)")  # fmt: skip
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                   help="hf: transformers (default); vllm: lm-eval's vLLM backend with olmo_repo's vLLM plugin "
                   "(same tasks, prompts, scorer and YaRN; needs the vllm extra)")  # fmt: skip
    p.add_argument("--out", required=True, help="output directory (results.json, results.md, samples.jsonl)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace this tool's outputs in a non-empty --out"
    )
    return p


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lengths={text!r}: expected comma-separated integers such as 4096,8192") from None
    if not lengths or min(lengths) <= MAX_NEW_TOKENS:
        raise ValueError(
            f"--lengths={text!r}: every length must exceed the {MAX_NEW_TOKENS} generated tokens"
        )
    return lengths


def _variants(text: str) -> list[str]:
    if text == "niah":
        return list(VARIANTS)
    variants = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if not variants or unknown:
        raise ValueError(
            f"--tasks={text!r}: unknown task(s) {', '.join(unknown)}; allowed: niah or any of {', '.join(VARIANTS)}"
        )
    return variants


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out}: exists and is not empty; pass --overwrite to replace its results")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Validate, evaluate, write the outputs; return the results dict."""
    out = Path(args.out)
    _check_out(out, args.overwrite)
    variants = list(VARIANTS) if args.suite else _variants(args.tasks)
    lengths = _lengths(args.lengths or ("4096,8192,16384" if args.suite else "4096"))
    if args.samples is not None and args.samples < 1:
        raise ValueError(f"--samples={args.samples}: must be >= 1")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size={args.batch_size}: must be >= 1")
    yarn = parse_yarn(args.yarn)
    require_model_dir(args.model)  # missing, not a model or a damaged file: before the heavy imports

    import torch
    from transformers import AutoConfig, AutoTokenizer

    from ..eval import niah, suite
    from ..eval.loading import load_model, training_length, yarn_factor
    from ..hf.convert import as_hf_dir
    from ..upstream import lm_eval

    lm_eval.quiet()  # lm-eval's per-task notes on custom datasets are noise here; its errors still show
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")

    with as_hf_dir(args.model) as hf_dir:
        try:
            tokenizer = AutoTokenizer.from_pretrained(hf_dir)
        except (OSError, ValueError) as e:
            raise ValueError(f"{args.model}: no tokenizer could be loaded ({e})") from None
        training = training_length(AutoConfig.from_pretrained(hf_dir))
        stages = suite.plan(lengths) if args.suite else [(length, None) for length in lengths]
        refused: list[str] = []
        if args.suite:
            online = suite.network()
            refused = [t for _, tasks in stages for t in tasks if not suite.available(t, online)]
            refused = list(dict.fromkeys(refused))
            stages = [(length, [t for t in tasks if t not in refused]) for length, tasks in stages]
            # every task at every length, before any weights load: a length a task cannot build stops here
            suite.check_lengths(tokenizer, stages, args.seed, args.essays)
            if refused:
                print(suite.refusal(refused), file=sys.stderr)
        else:
            # a length the tokenizer cannot fill (or fit) stops here, before any weights
            for length in lengths:
                for variant in variants:
                    niah.niah_samples(tokenizer, variant, length, 1, args.seed, args.essays)

        results: dict[str, Any] = {
            "model": str(args.model),
            "mode": "suite:paper" if args.suite else "niah",
            "training_length": training,
            "samples": args.samples,
            "seed": args.seed,
            "essays": args.essays,
            "lengths": {},
            "scores": {},
        }
        records: list[dict] = []
        for length, tasks in stages:
            if args.suite and not tasks:  # every task of this length was refused
                continue
            factor = yarn_factor(length, training, yarn)
            if args.backend == "vllm":
                from ..vllm.eval import load_vllm

                model = load_vllm(hf_dir, length, yarn, dtype, args.batch_size)
            else:
                model = load_model(hf_dir, length, yarn, dtype, device)
            results["lengths"][str(length)] = {
                "yarn_factor": factor,
                "rope_parameters": dict(model.config.rope_parameters or {}),
            }
            if args.suite:
                task_results = suite.run_stage(
                    model, tokenizer, length, tasks, samples=args.samples, seed=args.seed,
                    batch_size=args.batch_size, essays=args.essays,
                )  # fmt: skip
                for task, metrics in task_results.items():
                    results["scores"].setdefault(task, {})[length] = suite.main_metric(metrics, length)
                results.setdefault("lm_eval", {})[str(length)] = task_results
            else:
                scores, stage_records = niah.evaluate(
                    model, tokenizer, length, variants=variants, samples=args.samples or 500, seed=args.seed,
                    batch_size=args.batch_size, essays=args.essays,
                )  # fmt: skip
                for variant, row in scores.items():
                    results["scores"].setdefault(variant, {}).update(row)
                records += stage_records
            if args.backend == "vllm":  # the next length starts its own engine
                from ..vllm.eval import release

                release(model)
            del model
        if refused:
            results["refused"] = refused

    table = _table(results, niah.markdown_table)
    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:  # a previous run's outputs (--overwrite); nothing else in --out is touched
        (out / name).unlink(missing_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(table)
    if records:
        (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    print(table)
    written = [name for name in OUTPUTS if (out / name).exists()]
    print(f"wrote {', '.join(str(out / name) for name in written)}")
    return results


def _table(results: dict[str, Any], niah_table: Any) -> str:
    head = f"# {results['mode']} on {results['model']}\n\n"
    if results["mode"] == "niah":
        return head + niah_table(results["scores"])
    scores = results["scores"]
    lengths = sorted({length for row in scores.values() for length in row})
    lines = ["| task | " + " | ".join(map(str, lengths)) + " |", "| --- |" + " ---: |" * len(lengths)]
    for task, row in scores.items():
        cells = [f"{100 * row[length]:.1f}" if row.get(length) is not None else "" for length in lengths]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    refused = results.get("refused")
    return (
        head
        + "\n".join(lines)
        + "\n"
        + (f"\nNot run (need downloading): {', '.join(refused)}\n" if refused else "")
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        run(args)
    except (ValueError, OSError, RepoError) as e:
        fail("eval.py", e)
        return 2
    return 0
