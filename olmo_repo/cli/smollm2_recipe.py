"""`scripts/smollm2_recipe.py [OUT_DIR]`: the paper's recipe at CPU scale on a real pretrained model, SmolLM2-135M,
with RePo in the layers the paper's rule picks and a RoPE control, and a report (`olmo_repo.experiments.smollm2.recipe`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import RepoError
from ..eval.variants import VARIANTS, parse_lengths
from . import command, require_extras, run

__all__ = ["add_recipe_options", "main", "recipe_from_args"]

PROG = "smollm2_recipe.py"

_EPILOG = """\
Stages, each a command of the project (docs/smollm2.md), recorded in OUT_DIR: the SmolLM2 directory
(scripts/smollm2.py), Python's documentation in its tokens with the last topics held out
(scripts/tokenize_text.py), the stock model as the OLMo-core stage-1 checkpoint (core_convert_from_hf.py), a run
of configs/olmocore/smollm2-repo.py per arm on the same batches (core_train.py --nproc-per-node; by default RePo
in the config's layers as the paper runs it, RePo set up to learn its positions, and RoPE), their checkpoints in
HF form (core_convert_to_hf.py), held-out losses (the RePo arms' also with their positions replaced by the token index
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
    from ..experiments.smollm2.options import Recipe  # light: dataclasses and pathlib

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Continue SmolLM2-135M-Instruct (Q4_1 dequantised) on OLMo-core with RePo in the layers "
        "the paper's rule picks, with RePo set up to learn its positions, and, as the control, with RoPE, on "
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
    add_recipe_options(parser, Recipe())
    return parser


def add_recipe_options(
    parser: argparse.ArgumentParser, default: Any, only: tuple[str, ...] | None = None
) -> None:
    """Declare the recipe's options on `parser` with `default`'s values (a `Recipe`), or those named in `only`:
    this command takes them all, the study (`position_study.py`) those it lets a user set."""
    from ..experiments.smollm2.options import KNOWN_ARMS

    options: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
        "steps": (("--steps",), dict(type=int, default=default.steps, help="training steps of each run, "
                  "each a batch of the config's (configs/olmocore/smollm2-repo.py) (default: "
                  f"{default.steps}, about one pass over the training text)")),
        "samples": (("--samples",), dict(type=int, default=default.samples,
                    help=f"NIAH prompts per variant and length (default: {default.samples})")),
        "lengths": (("--lengths",), dict(default=",".join(map(str, default.lengths)), help="NIAH context "
                    "lengths, comma-separated; the attention and position analyses run at the first (default: "
                    f"{','.join(map(str, default.lengths))})")),
        "variants": (("--variants",), dict(default=",".join(default.variants), help="RULER NIAH variants, "
                     f"comma-separated (default: {','.join(default.variants)})")),
        "heldout_topics": (("--heldout-topics",), dict(type=int, default=default.heldout_topics, help="topics of "
                           "the documentation held out for the held-out loss, the last by name (default: "
                           f"{default.heldout_topics})")),
        "model": (("--model",), dict(metavar="DIR", help="an existing SmolLM2 directory written by "
                  "scripts/smollm2.py (checked, not copied; default: one is written in OUT_DIR)")),
        "arms": (("--arms",), dict(default=",".join(arm.name for arm in default.arms), help="the runs, "
                 "comma-separated, each a few overrides of the config on the same batches: "
                 + "; ".join(f"{name} ({' '.join(a.args) or 'the paper'})" for name, a in KNOWN_ARMS.items())
                 + f" (default: {','.join(arm.name for arm in default.arms)})")),
        "procs": (("--procs",), dict(type=int, default=default.procs,
                  help=f"training processes per run (gloo, one thread each; default: {default.procs})")),
    }  # fmt: skip
    for name, (flags, kwargs) in options.items():
        if only is None or name in only:
            parser.add_argument(*flags, **kwargs)


def recipe_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, default: Any) -> Any:
    """The `Recipe` of the parsed `args`, `default`'s values for the options the parser does not take; a bad
    value is `parser.error` naming its flag."""
    import dataclasses

    from ..experiments.smollm2.options import KNOWN_ARMS

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(default) if hasattr(args, f.name)}
    if "lengths" in given:
        try:
            given["lengths"] = tuple(parse_lengths(given["lengths"]))
        except ValueError as e:
            parser.error(str(e))
    if "variants" in given:
        variants = tuple(v for v in args.variants.split(",") if v)
        if (unknown := [v for v in variants if v not in VARIANTS]) or not variants:
            parser.error(f"--variants {args.variants}: {'unknown ' + ', '.join(unknown) if unknown else 'none given'}; "
                         f"allowed: {', '.join(VARIANTS)}")  # fmt: skip
        given["variants"] = variants
    if "arms" in given:
        names = [a for a in args.arms.split(",") if a]
        if (
            (unknown := [a for a in names if a not in KNOWN_ARMS])
            or not names
            or len(set(names)) < len(names)
        ):
            why = "unknown " + ", ".join(unknown) if unknown else "each arm once" if names else "none given"
            parser.error(f"--arms {args.arms}: {why}; allowed: {', '.join(KNOWN_ARMS)}")
        given["arms"] = tuple(KNOWN_ARMS[name] for name in names)
    for name, flag in (("steps", "--steps"), ("samples", "--samples"), ("procs", "--procs"),
                       ("heldout_topics", "--heldout-topics")):  # fmt: skip
        if name in given and given[name] < 1:
            parser.error(f"{flag} must be at least 1; got {given[name]}")
    if "lengths" in given and min(given["lengths"]) < 1:
        parser.error(f"--lengths must be at least 1; got {min(given['lengths'])}")
    return dataclasses.replace(default, **given)


@command
def main(argv: list[str] | None = None) -> int:
    from ..experiments.smollm2.options import Recipe

    parser = _parser()
    args = parser.parse_args(argv)
    options = recipe_from_args(parser, args, Recipe())

    def recipe() -> None:
        from ..experiments.smollm2.recipe import check_checkout, run_recipe

        check_checkout()  # before the extras: a pip install has no recipe to run
        require_extras("olmo-core", "eval")
        run_recipe(args.out_dir, options)

    return run(PROG, recipe, lambda: (RepoError, ValueError, FileNotFoundError))


if __name__ == "__main__":
    raise SystemExit(main())
