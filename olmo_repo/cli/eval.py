"""`scripts/eval.py`: evaluate MODEL (an HF directory or an OLMo checkpoint of this project) on RULER NIAH at
several lengths, or on the paper's suite, with YaRN past the training length (`olmo_repo.eval.request` does it).

Every input is checked before any heavy work (the arguments and the model's files before torch, transformers
or lm-eval load; then that every task can build its prompts at each length with the model's tokenizer); a bad
one stops the run with one line and nothing written.
`--positions index|constant` scores the model with its RePo layers rotating by the token index (RoPE) or by one
constant position (NoPE) instead of the learned positions. Outputs in `--out`: `results.json`, `results.md` (the table) and, for NIAH, `samples.jsonl` (every sample's
answers, output and score). `--overwrite` replaces those files in an existing, non-empty `--out`; nothing
else there is touched. Exit status: 0 done, 1 an error said in one line, 2 a usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoint import as_hf_dir
from ..dtypes import DTYPE_NAMES
from ..eval.request import EvalRequest, evaluate_request, results_table, write_results
from ..eval.variants import (
    ESSAYS,
    NIAH_LENGTHS,
    RULER_SAMPLES,
    RULER_SEED,
    SUITE_LENGTHS,
    VARIANTS,
    parse_lengths,
    parse_tasks,
    parse_yarn,
)
from . import add_positions_argument, command, run

# The parser and the checks of the arguments and the model's files use only these light modules: `--help`,
# a bad flag and a missing model answer before torch, transformers and lm-eval load (seconds).


def _listed(lengths: tuple[int, ...]) -> str:
    return ",".join(map(str, lengths))


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
        help="comma-separated context lengths in the model's tokens (prompt + 128 generated tokens); default: "
        f"{_listed(NIAH_LENGTHS)} for --tasks, {_listed(SUITE_LENGTHS)} for --suite",
    )
    p.add_argument("--samples", type=int, help=f"samples per NIAH variant and length (default: RULER's "
                   f"{RULER_SAMPLES}); with --suite also lm-eval's limit per task")  # fmt: skip
    p.add_argument("--seed", type=int, default=RULER_SEED,
                   help=f"seed of the NIAH prompts (default: {RULER_SEED}, RULER's)")  # fmt: skip
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
    add_positions_argument(p)
    p.add_argument("--out", required=True, help="output directory (results.json, results.md, samples.jsonl)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace this tool's outputs in a non-empty --out"
    )
    return p


def _request(args: argparse.Namespace) -> EvalRequest:
    lengths = args.lengths or _listed(SUITE_LENGTHS if args.suite else NIAH_LENGTHS)
    return EvalRequest(
        model=args.model,
        out=Path(args.out),
        variants=tuple(VARIANTS) if args.suite else tuple(parse_tasks(args.tasks)),
        lengths=tuple(parse_lengths(lengths)),
        suite=bool(args.suite),
        samples=args.samples,
        seed=args.seed,
        batch_size=args.batch_size,
        yarn=parse_yarn(args.yarn),
        essays=args.essays,
        dtype=args.dtype,
        device=args.device,
        backend=args.backend,
        positions=args.positions,
        overwrite=args.overwrite,
    )


def _evaluate(args: argparse.Namespace) -> None:
    request = _request(args)
    evaluation = evaluate_request(request, open_model=as_hf_dir)
    written = write_results(request, evaluation)
    print(results_table(evaluation.results))
    print(f"wrote {', '.join(map(str, written))}")


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    needs = ("eval", "vllm") if args.backend == "vllm" else ("eval",)
    return run("eval.py", lambda: _evaluate(args), needs=needs)
