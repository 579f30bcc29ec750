"""`scripts/position_study.py [OUT_DIR]`: docs/research.md's study of learning positions on one machine
(`olmo_repo.experiments.study`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..errors import RepoError
from . import command, positive_int, require_extras, run
from .smollm2_recipe import add_recipe_options, recipe_from_args

__all__ = ["main"]

PROG = "position_study.py"

_EPILOG = """\
Two parts, each a resumable stage of OUT_DIR (a kill loses at most the model or run under way; rerun the same
command to continue):

1. SmolLM2-135M continued through the recipe (scripts/smollm2_recipe.py) in OUT_DIR/smollm2, with the study's
   arms, in this order: the paper's RePo; the index blend's warm start with f_phi's learning rate x240; RoPE;
   NoPE in RePo's layers; f_phi's learning rate x240; f_phi alone at x240; the blend at the paper's lr; f_phi's
   learning rate x30. Held-out loss at step 0 and the end (the
   RePo arms also with their positions replaced by the token index and by one constant), the positions' spread
   and order per layer, NIAH before and after with Wilson intervals;
2. from scratch: tiny Llama-shaped models trained on recall among distractors at one length, matched across
   arms (the same weights where they share a tensor, the same batches, the same tests): RePo above the lower
   third and its control (NoPE there, RoPE below) on --seeds seeds each; RoPE and NoPE in every layer on half
   of them; RePo with f_phi's lr x10, with the index blend, with f_phi's last layer 0, and for 3x the steps on
   a quarter. Tested at the training length (>= 90% of the queries: the model learned), at 4x and 8x it without
   and with YaRN, and with 2x and 4x the distractors; each arm's learned share over seeds with its interval,
   Fisher's test and the difference its seeds can detect (two models at a time, one core each, 4-5 minutes a
   model on a quiet machine, three times that for the longer arm; olmo_repo.experiments.study.task and
   .retrieval).

OUT_DIR/report.md gathers both with the commit, time and machine load each part ran at (and each model's).
About three hours of a quiet 2-core machine for each part at the defaults. Run it in the OLMo-core environment (make install-core), from a checkout:

    .venv-core/bin/python scripts/position_study.py                  # runs/position-study

Exit codes: 0 done, 1 a stage failed or bad input (one line), 2 bad arguments, 130 interrupted (rerun to resume).
"""


def _parser() -> argparse.ArgumentParser:
    from ..experiments.study.scratch import jobs
    from ..experiments.study.study import PARTS, Study  # light: dataclasses

    default = Study()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="What it takes for RePo's positions to be learned on one machine, and what they then do: "
        "tiny models from scratch on recall among distractors, and SmolLM2-135M continued in eight arms.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=Path("runs/position-study"),
        metavar="OUT_DIR",
        help="folder for everything the study writes: new, empty, or a previous study's (resumed; other files "
        "there stay) (default: runs/position-study)",
    )
    add_recipe_options(parser, default.recipe, only=("steps", "samples", "model"))
    parser.add_argument(
        "--seeds",
        type=positive_int,
        default=default.seeds,
        help="seeds of RePo and its matched control from scratch; RoPE and NoPE in every layer take half of "
        f"them, each of RePo's knobs and the longer arm a quarter (rounded up) (default: {default.seeds}: "
        f"{len(jobs(default.seeds))} models)",
    )
    parser.add_argument(
        "--scratch-steps",
        type=positive_int,
        default=default.scratch.steps,
        help=f"training steps of each from-scratch model (default: {default.scratch.steps})",
    )
    parser.add_argument(
        "--only",
        choices=PARTS,
        help="run this part alone (the other keeps what it has; the report shows both as far as they got): "
        "the from-scratch part takes minutes, the SmolLM2 part hours (default: both, SmolLM2 first)",
    )
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    from ..experiments.study.study import PARTS, Study

    parser = _parser()
    args = parser.parse_args(argv)
    default = Study()
    options = Study(
        recipe=recipe_from_args(parser, args, default.recipe),
        seeds=args.seeds,
        scratch=dataclasses.replace(default.scratch, steps=args.scratch_steps),
    )

    def study() -> None:
        from ..experiments.smollm2.recipe import check_checkout, check_model
        from ..experiments.study.study import run_study

        check_checkout("position_study")  # its second part is the SmolLM2 recipe: before hours of its first
        require_extras("olmo-core", "eval")
        check_model(args.model)  # before the study's folder is made
        run_study(args.out_dir, options, (args.only,) if args.only else PARTS)

    return run(PROG, study, lambda: (RepoError, ValueError, FileNotFoundError))


if __name__ == "__main__":
    raise SystemExit(main())
