"""`scripts/fetch.py CONFIG --to DIR|s3://BUCKET/PREFIX`: copy what a config reads remotely, and write the config
pointed at the copies (`olmo_repo.fetch.copies.fetch_config`)."""

from __future__ import annotations

import argparse
from urllib.parse import urlparse

from ..fetch import GROUPS
from ..terminal import check_printed
from . import command, run

__all__ = ["main"]

PROG = "fetch.py"

_EPILOG = """\
Every remote path the config reads is fetched: data.paths / data.datasets / data.label_mask_paths, a remote
tokenizer.identifier, the files of load_path that the start reads (config.yaml, model.pt, and optim.pt and
train.pt unless reset_optimizer_state / reset_trainer_state; a sharded checkpoint only from s3, which can
list it) and the evaluators' data. The copies live under the target as HOST/PATH (s3/BUCKET/KEY for s3
sources); the config, with those paths replaced (same order, every other key unchanged), is written to
TARGET/CONFIG_NAME.yaml (for an s3 target also to the --staging directory, for scripts/train.py):

    python scripts/fetch.py configs/official-1B-repo.yaml --to /data/olmo --dry-run
    python scripts/fetch.py configs/official-1B-repo.yaml --to /data/olmo
    torchrun --nproc_per_node=8 scripts/train.py /data/olmo/official-1B-repo.yaml

Rerunning resumes partial files and skips verified ones; a file that changed on the server is fetched again.
Exit codes: 0 complete, 1 incomplete (see the summary; rerun) or a bad config or target (one line), 2 bad
arguments, 130 interrupted (rerun to resume).
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s CONFIG --to DIR|s3://BUCKET/PREFIX [options] [--key=value ...]",
        description="Download the data, checkpoint and evaluation files an OLMo training config reads over "
        "http(s):// or s3://, verified and resumable, and write the config pointed at the local copies.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "config", metavar="CONFIG", help="training config (YAML), e.g. configs/official-1B-repo.yaml"
    )
    parser.add_argument(
        "--to",
        required=True,
        metavar="DIR|s3://BUCKET/PREFIX",
        help="where the copies go: a local directory (created if needed) or an s3:// prefix (boto3; "
        "AWS_ENDPOINT_URL and the usual AWS credentials apply)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (files, bytes, free space) and stop"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=GROUPS,
        help="fetch only this part (repeatable): data (training data and a remote tokenizer), checkpoint "
        "(load_path), eval (the evaluators' data). Default: all",
    )
    parser.add_argument("--jobs", type=int, default=8, metavar="N", help="files downloaded in parallel (8)")
    parser.add_argument(
        "--retries",
        type=int,
        default=5,
        metavar="N",
        help="retries of a file after a dropped connection, timeout or server error, each resuming where it "
        "stopped (5)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="seconds to connect or wait for data (60)"
    )
    parser.add_argument(
        "--staging",
        metavar="DIR",
        help="s3 targets only: local directory where files are downloaded before upload "
        "(default ~/.cache/olmo-repo/fetch/BUCKET/PREFIX)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    overrides = []
    for arg in rest:
        if not (arg.startswith("--") and "=" in arg):
            parser.error(f"unrecognized argument {arg}: config overrides take the form --key=value")
        overrides.append(arg[2:])
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.retries < 0:
        parser.error("--retries must be 0 or more")
    if args.staging and urlparse(args.to).scheme != "s3":
        parser.error("--staging is for s3:// targets only")
    return args, overrides


@command
def main(argv: list[str] | None = None) -> int:
    args, overrides = _parse(argv)

    def fetch() -> int:
        from ..fetch.copies import fetch_config

        outcome = fetch_config(
            args.config,
            args.to,
            overrides=overrides,
            only=args.only or GROUPS,
            jobs=args.jobs,
            retries=args.retries,
            timeout=args.timeout,
            staging=args.staging,
            dry_run=args.dry_run,
            progress=not args.no_progress,
        )
        if args.dry_run:
            check_printed("the plan")
        return 130 if outcome.interrupted else 0 if outcome.complete else 1

    return run(PROG, fetch, needs=("ai2-olmo",))
