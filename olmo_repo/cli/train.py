"""`scripts/train.py`: train with OLMo's Trainer and the RePo model (`olmo_repo.ai2olmo.train.train`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import RepoError, extras_missing
from . import Errors, command, fail, freeze_imported, run
from .launch import add_arguments, config_kind_problem, launched

__all__ = ["main"]

PROG = "train.py"

_EPILOG = """\
CONFIG is a YAML file (configs/*.yaml); each --key=value overrides a config key, dotted for nested keys
(--model.pe_start_layer=5, --save_folder=runs/x, --stop_at=100). The config's strategy (fsdp or ddp) on
nccl with CUDA, on gloo without. Rerunning the same command resumes from the latest checkpoint in
save_folder (or remote_save_folder). See docs/training.md.

    scripts/train.py --nproc-per-node=N CONFIG [--key=value ...]   # N processes (torchrun), checked first
    scripts/train.py CONFIG [--key=value ...]                      # one process
    scripts/train.py --check --nnodes=M --nproc-per-node=N CONFIG  # check a run, start nothing
"""


def _training_errors() -> Errors:
    """A config or checkpoint problem (OLMo's error, or this project's) is one line; anything else in a
    training run keeps its traceback."""
    from olmo.exceptions import OLMoError

    return RepoError, OLMoError


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s [--nproc-per-node N] [--check [--nnodes M]] CONFIG [--key=value ...]",
        description="Train with OLMo's Trainer and the RePo model.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "config", metavar="CONFIG", help="training config (YAML), e.g. configs/official-1B-repo.yaml"
    )
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parser.parse_known_args(argv)
    for arg in overrides:
        if not (arg.startswith("--") and "=" in arg):
            parser.error(f"unrecognized argument {arg}: config overrides take the form --key=value")
    if not Path(args.config).is_file():  # before the imports, which take seconds
        return fail(
            PROG, f"config file {args.config} does not exist (expected a YAML file such as configs/*.yaml)"
        )
    if problem := config_kind_problem(args.config, "ai2-olmo") or extras_missing("ai2-olmo"):
        return fail(PROG, problem)

    def check(world_size: int, local_world_size: int) -> None:
        from ..ai2olmo.train import check

        check(args.config, overrides, world_size=world_size, local_world_size=local_world_size)

    status = launched(parser, args, argv, "olmo_repo.cli.train", check, _training_errors)
    if status is not None:
        return status

    def train() -> None:
        from ..ai2olmo.niah import install
        from ..ai2olmo.train import train

        install()  # OLMo's evaluator building routes `niah_*` entries to olmo_repo.ai2olmo.niah
        freeze_imported()
        train(args.config, overrides)

    return run(PROG, train, _training_errors)


if __name__ == "__main__":  # `python -m olmo_repo.cli.train`, as the demo starts its runs
    raise SystemExit(main())
