"""`scripts/fetch.py CONFIG --to DIR|s3://BUCKET/PREFIX`: copy what a config reads remotely, and write the config
pointed at the copies. Errors a user can fix end in one line on stderr and exit code 2 (1: the fetch ran but
is incomplete; 130: interrupted)."""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlparse

from ..fetch.errors import FetchError
from ..fetch.plan import GROUPS

__all__ = ["main"]

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
Exit codes: 0 complete, 1 incomplete (see the summary; rerun), 2 bad arguments or config, 130 interrupted.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/fetch.py",
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


def main(argv: list[str] | None = None) -> int:
    args, overrides = _parse(argv)
    try:
        return _fetch(args, overrides)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # while planning: nothing was written yet
        print("interrupted before any download; nothing was written", file=sys.stderr)
        return 130


def _source_of(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


def _print_plan(config: str, target, items, only) -> None:
    from ..fetch.transfer import human

    print(f"plan: {config} -> {target} (free: {human(target.free_bytes())})")
    rows: dict[tuple[str, str], list] = defaultdict(list)
    for item in items:
        rows[(item.probed.source.group, _source_of(item.url))].append(item)
    print(f"  {'group':<11}{'source':<40}{'files':>6}{'bytes':>12}{'to download':>14}")
    for (group, source), group_items in rows.items():
        size = sum(i.remote.size for i in group_items if i.probed.remote is not None)
        todo = sum(i.todo for i in group_items)
        print(f"  {group:<11}{source:<40}{len(group_items):>6}{human(size):>12}{human(todo):>14}")
    size = sum(i.remote.size for i in items if i.probed.remote is not None)
    print(f"  {'total':<51}{len(items):>6}{human(size):>12}{human(sum(i.todo for i in items)):>14}")
    by_state: dict[str, list] = defaultdict(list)
    for item in items:
        by_state[item.state].append(item)
    notes = {
        "done": "already fetched and unchanged on the server",
        "resume": "partly fetched: resume",
        "upload": "downloaded: upload",
        "stale": "changed on the server since they were fetched: fetch again",
        "kept": "no longer on the server: the earlier copy stays",
    }
    for state, note in notes.items():
        if by_state[state]:
            print(f"  {len(by_state[state])} file(s) {note}")
            if state in ("stale", "kept"):
                for item in by_state[state][:10]:
                    print(f"    {item.url}")
    if by_state["missing"]:
        print(f"  {len(by_state['missing'])} file(s) cannot be fetched:")
        for item in by_state["missing"][:20]:
            print(f"    {item.probed.source.key}: {item.probed.problem}")


def _fetch(args: argparse.Namespace, overrides: list[str]) -> int:
    from ..fetch.plan import (
        checkpoint_sources,
        config_sources,
        load_config,
        local_name,
        probe,
        rewrite_config,
    )
    from ..fetch.transfer import human, make_target, plan_items, run

    only = tuple(args.only or GROUPS)
    target = make_target(args.to, args.staging)
    cfg = load_config(args.config, overrides)
    sources = config_sources(cfg, only)
    if "checkpoint" in only:
        sources += checkpoint_sources(cfg, args.timeout)
    if not sources:
        print(f"{args.config}: nothing to fetch ({', '.join(only)}: no http(s):// or s3:// paths)")
        return 0
    probed = probe(sources, args.jobs, args.timeout)
    if all(p.remote is None for p in probed):
        raise FetchError(f"no file could be fetched: {probed[0].problem}")
    items = plan_items(probed, target)
    _print_plan(args.config, target, items, only)

    config_name = Path(args.config).stem + ".yaml"
    conflicts = [target.location(i.name) for i in items if i.state == "conflict"]
    if clash := target.config_conflict(config_name):
        conflicts.append(clash)
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise FetchError(
            f"{conflicts[0]}{more} exists and was not written by fetch: move it away or choose another --to"
        )
    target.check(items, args.jobs)
    if args.dry_run:
        return 0

    start = time.monotonic()
    outcome = run(
        items,
        target,
        jobs=args.jobs,
        retries=args.retries,
        timeout=args.timeout,
        progress=not args.no_progress,
    )
    seconds = time.monotonic() - start
    fetched = sum(i.remote.size for i in outcome.fetched)
    print(
        f"fetched {len(outcome.fetched)} file(s), {human(fetched)} in {seconds:.1f} s; "
        f"{sum(i.state == 'done' for i in items)} already there"
    )
    missing = [(i, i.probed.problem) for i in items if i.state == "missing"] + outcome.missing
    for title, entries in (
        ("missing on the server", missing),
        ("changed on the server while fetching (rerun fetches the new version)", outcome.changed),
        ("failed (rerun resumes them)", outcome.failed),
    ):
        if entries:
            print(f"{title}: {len(entries)} file(s)")
            for item, why in entries[:20]:
                print(f"  {item.probed.source.key}: {why}")
    if outcome.disk_full:
        print(
            f"disk full ({outcome.disk_full}): {len(outcome.not_started)} file(s) not fetched; free space "
            f"at {target} and rerun (partial files resume)"
        )
    elif outcome.interrupted:
        print(
            f"interrupted: {len(outcome.not_started)} file(s) not finished; rerun the same command to resume"
        )
    elif outcome.not_started:
        print(f"{len(outcome.not_started)} file(s) not fetched; rerun to fetch them")
    if missing or not outcome.complete:
        print(
            f"incomplete: no config written; rerun `scripts/fetch.py {args.config} --to {args.to}` when fixed"
        )
        return 130 if outcome.interrupted else 1

    copies = {i.url: target.location(i.name) for i in items}
    if cfg.load_path is not None and any(i.probed.source.group == "checkpoint" for i in items):
        base = str(cfg.load_path).rstrip("/")
        copies[base] = target.location(local_name(base))
    text = (
        f"# Written by scripts/fetch.py from {args.config}"
        + (f" with {' '.join('--' + o for o in overrides)}" if overrides else "")
        + f": remote paths replaced by their copies under {target}.\n"
        + rewrite_config(args.config, overrides, cfg, copies)
    )
    written = target.write_config(config_name, text)
    _check_rewritten(written[0], cfg, copies)
    for path in written:
        print(f"config: {path}")
    return 0


def _check_rewritten(path: str, cfg, copies: dict[str, str]) -> None:
    """The written config reads exactly the copies of what the original read, in the same order."""
    from ..fetch.plan import load_config

    new = load_config(path, [])

    def paths(c) -> list:
        out: list = [c.tokenizer.identifier, c.load_path and str(c.load_path).rstrip("/")]
        for data in [c.data] + [e.data for e in c.evaluators]:
            out += list(data.paths or []) + list(data.label_mask_paths or [])
            out += [(k, list(v)) for k, v in (data.datasets or {}).items()]
        return out

    def mapped(value):
        if isinstance(value, tuple):
            return (value[0], [copies.get(p, p) for p in value[1]])
        return copies.get(value, value) if isinstance(value, str) else value

    if paths(new) != [mapped(v) for v in paths(cfg)]:
        raise FetchError(f"{path}: the written config does not read the fetched copies; please report this")
