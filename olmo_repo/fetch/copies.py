"""What `scripts/fetch.py` does: `fetch_config` plans the copies of what a config reads remotely, prints the
plan, checks it (files in the way, free space), fetches, prints what happened and, once every file is there,
writes the config pointed at the copies. Rerunning it resumes partial files, skips verified ones, and leaves
a complete copy exactly as it was."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..errors import command
from .errors import FetchError
from .plan import (
    GROUPS,
    check_rewritten_config,
    checkpoint_sources,
    config_sources,
    load_config,
    local_name,
    probe,
    rewrite_config,
)
from .targets import Item, LocalTarget, S3Target, human, make_target, plan_items
from .transfer import Outcome, fetch_items

__all__ = ["check_plan", "fetch_config", "plan_config", "print_plan", "print_summary", "write_fetched_config"]

Target = LocalTarget | S3Target

_NOTES = {
    "done": "already fetched and unchanged on the server",
    "resume": "partly fetched: resume",
    "upload": "downloaded: upload",
    "stale": "changed on the server since they were fetched: fetch again",
    "kept": "no longer on the server: the earlier copy stays",
}


def fetch_config(
    config: str,
    to: str,
    *,
    overrides: Sequence[str] = (),
    only: Sequence[str] = GROUPS,
    jobs: int = 8,
    retries: int = 5,
    timeout: float = 60.0,
    staging: str | None = None,
    dry_run: bool = False,
    progress: bool = True,
) -> Outcome:
    """Copy every remote file the training config `config` (with `--key=value` `overrides`) reads in the parts
    `only` (GROUPS) to `to` (a directory or s3://BUCKET/PREFIX; `staging`: where an s3 target's downloads wait),
    then write the config pointed at the copies there. Prints the plan and a summary; FetchError for what a
    user must fix before anything is fetched. The returned outcome lists what was not fetched (the plan's
    missing files included): a config is written only when it is complete."""
    target = make_target(to, staging)
    cfg = load_config(config, list(overrides))
    items = plan_config(cfg, target, tuple(only), jobs, timeout)
    if not items:
        print(f"{config}: nothing to fetch ({', '.join(only)}: no http(s):// or s3:// paths)")
        return Outcome()
    print_plan(config, target, items)
    check_plan(items, target, _config_name(config), jobs)
    if dry_run:
        return Outcome()
    start = time.monotonic()
    outcome = fetch_items(items, target, jobs=jobs, retries=retries, timeout=timeout, progress=progress)
    outcome.missing[:0] = [(i, i.probed.problem or "") for i in items if i.state == "missing"]
    print_summary(items, outcome, time.monotonic() - start, target)
    if not outcome.complete:
        print(f"incomplete: no config written; rerun `{command('fetch')} {config} --to {to}` when fixed")
        return outcome
    for path in write_fetched_config(config, overrides, cfg, items, target):
        print(f"config: {path}")
    return outcome


def _config_name(config: str) -> str:
    return Path(config).stem + ".yaml"


def plan_config(cfg: Any, target: Target, only: tuple[str, ...], jobs: int, timeout: float) -> list[Item]:
    """What to do with each remote file of `cfg` at `target` (probed on the servers); [] when it reads none.
    FetchError when not one of them can be fetched."""
    sources = config_sources(cfg, only)
    if "checkpoint" in only:
        sources += checkpoint_sources(cfg, timeout)
    if not sources:
        return []
    probed = probe(sources, jobs, timeout)
    if all(p.remote is None for p in probed):
        raise FetchError(f"no file could be fetched: {probed[0].problem}")
    return plan_items(probed, target)


def check_plan(items: list[Item], target: Target, config_name: str, jobs: int) -> None:
    """FetchError, before anything is written, for a file in the way that fetch did not write (a copy or the
    config), an unwritable target or too little free space."""
    conflicts = [target.location(i.name) for i in items if i.state == "conflict"]
    if clash := target.config_conflict(config_name):
        conflicts.append(clash)
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise FetchError(
            f"{conflicts[0]}{more} exists and was not written by fetch: move it away or choose another --to"
        )
    target.check(items, jobs)


def _server(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


def print_plan(config: str, target: Target, items: list[Item]) -> None:
    """The plan: files and bytes per part and server, what is there already, what cannot be fetched."""
    print(f"plan: {config} -> {target} (free: {human(target.free_bytes())})")
    rows: dict[tuple[str, str], list[Item]] = defaultdict(list)
    for item in items:
        rows[(item.probed.source.group, _server(item.url))].append(item)
    print(f"  {'group':<11}{'source':<40}{'files':>6}{'bytes':>12}{'to download':>14}")
    for (group, source), group_items in rows.items():
        size = sum(i.remote.size for i in group_items if i.probed.remote is not None)
        todo = sum(i.todo for i in group_items)
        print(f"  {group:<11}{source:<40}{len(group_items):>6}{human(size):>12}{human(todo):>14}")
    size = sum(i.remote.size for i in items if i.probed.remote is not None)
    print(f"  {'total':<51}{len(items):>6}{human(size):>12}{human(sum(i.todo for i in items)):>14}")
    by_state: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        by_state[item.state].append(item)
    for state, note in _NOTES.items():
        if by_state[state]:
            print(f"  {len(by_state[state])} file(s) {note}")
            if state in ("stale", "kept"):
                for item in by_state[state][:10]:
                    print(f"    {item.url}")
    if by_state["missing"]:
        print(f"  {len(by_state['missing'])} file(s) cannot be fetched:")
        for item in by_state["missing"][:20]:
            print(f"    {item.probed.source.key}: {item.probed.problem}")


def print_summary(items: list[Item], outcome: Outcome, seconds: float, target: Target) -> None:
    """What the fetch did, and for every file it could not fetch why and what to do."""
    fetched = sum(i.remote.size for i in outcome.fetched)
    print(
        f"fetched {len(outcome.fetched)} file(s), {human(fetched)} in {seconds:.1f} s; "
        f"{sum(i.state == 'done' for i in items)} already there"
    )
    for title, entries in (
        ("missing on the server", outcome.missing),
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


def write_fetched_config(
    config: str, overrides: Sequence[str], cfg: Any, items: list[Item], target: Target
) -> list[str]:
    """Write `config` (with `overrides`) pointed at the copies of `items` to the target as CONFIG_NAME.yaml,
    checked to read exactly those copies; returns where it went."""
    copies = {i.url: target.location(i.name) for i in items}
    if cfg.load_path is not None and any(i.probed.source.group == "checkpoint" for i in items):
        base = str(cfg.load_path).rstrip("/")
        copies[base] = target.location(local_name(base))
    text = (
        f"# Written by scripts/fetch.py from {config}"
        + (f" with {' '.join('--' + o for o in overrides)}" if overrides else "")
        + f": remote paths replaced by their copies under {target}.\n"
        + rewrite_config(config, list(overrides), cfg, copies)
    )
    written = target.write_config(_config_name(config), text)
    check_rewritten_config(written[0], cfg, copies)
    return written
