"""`make demo`: build a tiny corpus offline, continue the shipped tiny base model with RoPE on CPU, then with
RoPE, RePo and NoPE through `olmo_repo.cli.train`, print a table and write report.md as each part is ready (see
docs/demo.md). A rerun resumes an interrupted demo and skips what finished with the same inputs;
report.md is assembled from what every stage recorded, so a rerun of a finished demo leaves it as it was."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import RepoError
from ..eval.variants import parse_lengths
from . import command, run

__all__ = ["main"]

PROG = "demo.py"


@command
def main(argv: list[str] | None = None) -> int:
    import yaml  # light (the configs' sizes, not torch), and in the base install: --help needs no extra

    from ..experiments.demo import PROCS, SAMPLES, config_path

    stage1, stage2 = (
        yaml.safe_load(config_path(name).read_text())["max_duration"]
        for name in ("stage1-rope", "stage2-rope")
    )
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=Path("runs/demo"),
        metavar="OUT_DIR",
        help="folder for the demo's outputs (corpus, five runs, their logs, the report): a new or empty "
        "folder, or a previous demo's, which is resumed (finished stages with unchanged inputs are skipped) "
        "while other files in it stay (default: runs/demo in the current directory)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=SAMPLES,
        help=f"NIAH prompts per variant: in-loop during training (every eval_interval steps) and per length in "
        f"the report's evaluation (default: {SAMPLES}, as in the configs)",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=PROCS,
        help=f"training processes per run, one thread each (default: {PROCS}, torchrun's layout; 1: one process "
        "with torch's default threads)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        nargs=2,
        metavar=("STAGE1", "STAGE2"),
        help=f"training steps of stage 1 and of stage 2 (default and most: the configs', {stage1} and {stage2}); "
        "the corpus holds the windows they read, one per sequence",
    )
    parser.add_argument(
        "--lengths",
        help="the report's NIAH context lengths in tokens, comma-separated, e.g. 512 (default: the training "
        "length, 2x and 4x, past the training length with YaRN); the attention and position analyses run at "
        "the first",
    )
    args = parser.parse_args(argv)
    if args.samples < 1 or args.procs < 1:
        parser.error("--samples and --procs must be at least 1")
    try:
        lengths = args.lengths and tuple(parse_lengths(args.lengths))
    except ValueError as e:
        parser.error(str(e))
    if args.steps is not None and not (0 < args.steps[0] <= stage1 and 0 < args.steps[1] <= stage2):
        parser.error(
            f"--steps {args.steps[0]} {args.steps[1]}: stage 1 takes 1..{stage1} steps, stage 2 1..{stage2}"
        )

    def demo() -> None:
        from ..experiments.demo.demo import (
            run_demo,  # after --help and argument errors: the demo imports torch and OLMo
        )

        run_demo(
            args.out_dir,
            samples=args.samples,
            procs=args.procs,
            steps=args.steps and tuple(args.steps),
            lengths=lengths,
        )

    return run(PROG, demo, lambda: (RepoError,), needs=("ai2-olmo", "eval"))


if __name__ == "__main__":
    raise SystemExit(main())
