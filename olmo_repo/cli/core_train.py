"""`scripts/core_train.py`: train with OLMo-core's Trainer from a config of configs/olmocore/ (.venv-core).

The options are OLMo-core's own (`olmo_core.script_utils.get_cli_parser`: the official scripts take them), parsed
here before anything heavy is imported; every other argument is a dotted override, `--key=value`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..errors import RepoError, extras_missing
from ..terminal import check_printed
from . import Errors, command, fail, freeze_imported, positive_int
from .launch import add_arguments, config_kind_problem, launched

__all__ = ["main"]

_OVERRIDE = re.compile(r"--?[A-Za-z_][\w.\-]*=.*")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="core_train.py",
        usage="core_train.py CONFIG.py --save-folder DIR [OPTIONS...] [--key=value ...]",
        description="Train with OLMo-core's Trainer (run it with .venv-core/bin/): a config file of configs/olmocore/ "
        "defining build_config(opts, overrides) -> ExperimentConfig, OLMo-core's options, and dotted overrides of "
        "the ExperimentConfig (--train_module.optim.lr=1e-4, --load_path=DIR, ...). With --nproc-per-node=N the run "
        "is checked once here, then N processes start through torchrun.",
        allow_abbrev=False,
    )
    p.add_argument("config", help="the config file (configs/olmocore/*.py)")
    p.add_argument(
        "--save-folder", required=True, help="checkpoint folder (local, or s3://...); reruns resume it"
    )
    p.add_argument("--data-root", default="https://olmo-data.org", help="root of the data files")
    p.add_argument(
        "--work-dir", default=None, help="dataset cache and working files (default: the save folder)"
    )
    p.add_argument("--name", default=None, help="the run's name for logging (W&B)")
    p.add_argument(
        "--sequence-length", type=positive_int, default=None, help="training length (default: the config's)"
    )
    p.add_argument("--dry-run", action="store_true", help="check and print the config, then exit")
    add_arguments(p)
    return p


@command
def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    opts, overrides = parser.parse_known_args(argv)
    if bad := [a for a in overrides if not _OVERRIDE.fullmatch(a)]:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides are --key=value)")
    if not Path(opts.config).is_file():  # before OLMo-core loads (seconds)
        return fail("core_train.py", f"{opts.config}: no such config file (see configs/olmocore/)")
    if problem := config_kind_problem(opts.config, "olmo-core") or extras_missing("olmo-core"):
        return fail("core_train.py", problem)
    from olmo_core.exceptions import OLMoConfigurationError

    from ..olmocore.checks import check_experiment
    from ..olmocore.train import build, load_build_config, run, work_dir

    opts.work_dir = opts.work_dir or work_dir(opts.save_folder)

    def errors() -> Errors:
        return RepoError, OLMoConfigurationError, OSError

    def check(world_size: int, local_world_size: int) -> None:
        check_experiment(build(load_build_config(opts.config), opts, overrides), world_size)

    status = launched(parser, opts, argv, "olmo_repo.cli.core_train", check, errors)
    if status is not None:
        return status
    freeze_imported()
    try:
        run(build(load_build_config(opts.config), opts, overrides), opts)
        if opts.dry_run:
            check_printed("the config")
    except errors() as e:
        return fail("core_train.py", e)
    return 0


if __name__ == "__main__":  # the module torchrun's workers run (`--nproc-per-node`)
    raise SystemExit(main())
