"""`scripts/smollm2_recipe.py [OUT_DIR]`: the paper's recipe at CPU scale on a real pretrained model, SmolLM2-135M,
with RePo from its 10th layer and a RoPE control, and a report (`olmo_repo.recipe`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import RepoError
from ..eval.variants import VARIANTS, parse_lengths
from . import command, require_extras, run

__all__ = ["main"]

PROG = "smollm2_recipe.py"

_EPILOG = """\
Stages, each a command of the project (docs/smollm2.md), recorded in OUT_DIR: the SmolLM2 directory
(scripts/smollm2.py), Python's documentation in its tokens with the last topics held out
(scripts/tokenize_text.py), the stock model as the OLMo-core stage-1 checkpoint (core_convert_from_hf.py), a run
of configs/olmocore/smollm2-repo.py per arm on the same batches (core_train.py --nproc-per-node; by default RePo in
layers 9..29 as the paper runs it, RePo set up to learn its positions, and RoPE), their checkpoints in HF form
(core_convert_to_hf.py), held-out losses (the RePo arms' also with their positions replaced by the token index
and by one constant), then NIAH, attention mass and learned positions (olmo_repo.eval.report). OUT_DIR/report.md is rewritten as each
stage finishes. A rerun skips the stages that finished with the same options and resumes an interrupted
training run from its checkpoint; changing an option redoes the stages it affects.

Run it in the OLMo-core environment (make install-core), from a checkout:

    .venv-core/bin/python scripts/smollm2_recipe.py                 # runs/smollm2-recipe, ~80 min on 2 cores
    .venv-core/bin/python scripts/smollm2_recipe.py --steps 20 --samples 4 runs/recipe-short

Exit codes: 0 done, 1 a stage failed or bad input (one line naming the log or the file), 2 bad arguments,
130 interrupted (rerun to resume).
"""


def _parser() -> argparse.ArgumentParser:
    from ..recipe import KNOWN_ARMS, Recipe  # light: dataclasses and pathlib

    default = Recipe()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Continue SmolLM2-135M-Instruct (Q4_1 dequantised) on OLMo-core with RePo from its 10th "
        "layer as the paper runs it, with RePo set up to learn its positions, and, as the control, with RoPE, on "
        "the same data for the same steps; report the insertion cost, the loss curves, NIAH before and after, "
        "and the learned positions.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=Path("runs/smollm2-recipe"),
        metavar="OUT_DIR",
        help="folder for everything the recipe writes: new, empty, or a previous recipe's (resumed; other "
        "files there stay) (default: runs/smollm2-recipe)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=default.steps,
        help=f"training steps of each run, 4 x 256 tokens each (default: {default.steps}, about one pass over the "
        "training text)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=default.samples,
        help=f"NIAH prompts per variant and length (default: {default.samples})",
    )
    parser.add_argument(
        "--lengths",
        default=",".join(map(str, default.lengths)),
        help="NIAH context lengths, comma-separated; the attention and position analyses run at the first "
        f"(default: {','.join(map(str, default.lengths))})",
    )
    parser.add_argument(
        "--variants",
        default=",".join(default.variants),
        help=f"RULER NIAH variants, comma-separated (default: {','.join(default.variants)})",
    )
    parser.add_argument(
        "--heldout-topics",
        type=int,
        default=default.heldout_topics,
        help=f"topics of the documentation held out for the held-out loss, the last by name (default: "
        f"{default.heldout_topics})",
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="an existing SmolLM2 directory written by scripts/smollm2.py (checked, not copied; default: one is "
        "written in OUT_DIR)",
    )
    parser.add_argument(
        "--arms",
        default=",".join(arm.name for arm in default.arms),
        help="the runs, comma-separated, each a few overrides of the config on the same batches: "
        + "; ".join(f"{name} ({' '.join(a.overrides) or 'the paper'})" for name, a in KNOWN_ARMS.items())
        + f" (default: {','.join(arm.name for arm in default.arms)})",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=default.procs,
        help=f"training processes per run (gloo, one thread each; default: {default.procs})",
    )
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    from ..recipe import KNOWN_ARMS, Recipe

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        lengths = tuple(parse_lengths(args.lengths))
    except ValueError as e:
        parser.error(str(e))
    variants = tuple(v for v in args.variants.split(",") if v)
    if (unknown := [v for v in variants if v not in VARIANTS]) or not variants:
        parser.error(f"--variants {args.variants}: {'unknown ' + ', '.join(unknown) if unknown else 'none given'}; "
                     f"allowed: {', '.join(VARIANTS)}")  # fmt: skip
    names = [a for a in args.arms.split(",") if a]
    if (unknown := [a for a in names if a not in KNOWN_ARMS]) or not names or len(set(names)) < len(names):
        why = "unknown " + ", ".join(unknown) if unknown else "each arm once" if names else "none given"
        parser.error(f"--arms {args.arms}: {why}; allowed: {', '.join(KNOWN_ARMS)}")
    for flag, value in (("--steps", args.steps), ("--samples", args.samples), ("--procs", args.procs),
                        ("--heldout-topics", args.heldout_topics), ("--lengths", min(lengths))):  # fmt: skip
        if value < 1:
            parser.error(f"{flag} must be at least 1; got {value}")

    def recipe() -> None:
        from ..recipe import check_checkout, run_recipe

        check_checkout()  # before the extras: a pip install has no recipe to run
        require_extras("olmo-core", "eval")
        options = Recipe(
            args.steps, args.heldout_topics, lengths, variants, args.samples, args.procs, args.model,
            tuple(KNOWN_ARMS[name] for name in names),
        )  # fmt: skip
        run_recipe(args.out_dir, options)

    return run(PROG, recipe, lambda: (RepoError, ValueError, FileNotFoundError))


if __name__ == "__main__":
    raise SystemExit(main())
