"""Downloads into a target (`olmo_repo.fetch.targets`: a local directory or an s3:// prefix): resumable,
verified, in parallel.

A file is written to `NAME.fetching` (with `NAME.fetching.json` saying which server file it is a part of),
resumed from its length with a range request, checked (size; MD5 where the ETag is one, as S3 gives for
single-part objects) and only then renamed to NAME, so a file under its final name is always complete. The
target then records it (`claim`, `commit`): a local one in its manifest, an s3 one by uploading it (multipart,
parallel parts; the object appears whole or not at all) with url/size/ETag in the object's metadata.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from ..output import remove_partials
from .errors import FetchError
from .remote import Changed, NotFound, RemoteFile, Transient, open_from
from .targets import PART, TO_FETCH, Item, LocalTarget, S3Target, file_record, part_length, write_json

__all__ = ["INTERRUPTING", "Outcome", "download", "fetch_items"]

INTERRUPTING = "interrupted: each download stops at its next chunk, its part kept for the next run"


class Interrupted(FetchError):
    """Stopped by SIGINT or by another file's fatal error (a full disk)."""


class Corrupt(FetchError):
    """The downloaded bytes do not match the server's checksum."""


def _md5_etag(etag: str | None) -> str | None:
    """The MD5 an ETag stands for, when it is one (S3 single-part objects and many static servers)."""
    value = (etag or "").strip('"')
    return value if re.fullmatch(r"[0-9a-f]{32}", value) else None


def download(
    remote: RemoteFile,
    dest: Path,
    stop: threading.Event,
    progress: Callable[[int], object],
    retries: int,
    timeout: float,
    claim: Callable[[str | None], object] | None = None,
) -> str | None:
    """Fetch `remote` to `dest` (resuming `dest.fetching`); returns the verified MD5, if the ETag gave one.
    `claim(md5)` runs once the download is verified, before it takes its final name.

    Raises NotFound, Changed (the part is discarded), Transient after `retries` retries (the part is kept),
    Interrupted when `stop` is set (kept), Corrupt (discarded), OSError (a full disk: kept).
    """
    part = dest.with_name(dest.name + PART)
    meta = part.with_name(part.name + ".json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if part_length(dest, remote) == 0:
        part.unlink(missing_ok=True)  # ours (by its name), for another version of the file or empty
    remove_partials(meta)
    write_json(meta, file_record(remote))
    part.touch()
    failures = 0
    while (have := part.stat().st_size) != remote.size:
        if have > remote.size:
            part.write_bytes(b"")
            continue
        try:
            with open_from(remote, have, timeout) as (offset, chunks), open(part, "r+b") as f:
                f.seek(offset)
                f.truncate()
                progress(offset - have)  # negative when the server restarts the file from 0
                for chunk in chunks:
                    if stop.is_set():
                        raise Interrupted(f"{remote.url}: interrupted")
                    f.write(chunk)
                    progress(len(chunk))
                f.flush()
                os.fsync(f.fileno())
            failures = 0 if part.stat().st_size > have else failures + 1
            if failures > retries:
                raise Transient(f"{remote.url}: the server keeps ending the file early")
        except Transient:
            failures += 1
            if failures > retries:
                raise
            if stop.wait(min(0.2 * 2**failures, 10.0)):  # back off; a SIGINT cuts the wait short
                raise Interrupted(f"{remote.url}: interrupted") from None
        except Changed:
            part.unlink(missing_ok=True)
            meta.unlink(missing_ok=True)
            raise
    md5 = _md5_etag(remote.etag)
    if md5 is not None:
        digest = hashlib.md5()
        with open(part, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
        if digest.hexdigest() != md5:
            part.unlink()
            meta.unlink(missing_ok=True)
            raise Corrupt(f"{remote.url}: MD5 {digest.hexdigest()} of the download does not match ETag {md5}")
    if claim is not None:
        claim(md5)
    meta.unlink(missing_ok=True)  # first: a kill before the rename then costs a refetch, never a stray record
    os.replace(part, dest)
    return md5


@dataclass
class Outcome:
    """What a fetch did with the items it was given (those it did not have to fetch are in none of the lists)."""

    fetched: list[Item] = field(default_factory=list)
    missing: list[tuple[Item, str]] = field(default_factory=list)
    changed: list[tuple[Item, str]] = field(default_factory=list)
    failed: list[tuple[Item, str]] = field(default_factory=list)
    not_started: list[Item] = field(default_factory=list)
    disk_full: str | None = None
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return not (self.missing or self.changed or self.failed or self.not_started or self.disk_full)

    def add(self, item: Item, future: Future, target: LocalTarget | S3Target, stop: threading.Event) -> None:
        """Sort the finished (or cancelled) download of `item` into the outcome. A full disk sets `stop` for every
        worker; an error that is not the server's, the network's or the disk's sets it too and is raised."""
        if future.cancelled():
            self.not_started.append(item)
            return
        e = future.exception()
        if e is None:
            self.fetched.append(item)
        elif isinstance(e, NotFound):
            self.missing.append((item, str(e)))
        elif isinstance(e, Changed):
            self.changed.append((item, str(e)))
        elif isinstance(e, Interrupted):
            self.not_started.append(item)
        elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            self.disk_full = self.disk_full or f"{e.filename or target}: {e.strerror}"
            self.not_started.append(item)
            stop.set()
        elif isinstance(e, OSError):
            self.failed.append((item, f"{e.filename}: {e.strerror}"))
        elif isinstance(e, FetchError):
            self.failed.append((item, str(e)))
        else:
            stop.set()
            raise e


def fetch_items(
    items: list[Item],
    target: LocalTarget | S3Target,
    *,
    jobs: int,
    retries: int,
    timeout: float,
    progress: bool = True,
) -> Outcome:
    """Fetch every item that needs it, `jobs` at a time, with one progress bar (bytes, rate, ETA).

    SIGINT (KeyboardInterrupt) and a full disk stop every worker at its next chunk; partial files stay
    under `.fetching` names for the next run."""
    from tqdm import tqdm

    outcome = Outcome()
    todo = [i for i in items if i.state in TO_FETCH]
    stop = threading.Event()
    bar = tqdm(
        total=sum(i.todo for i in todo),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="fetch",
        file=sys.stderr,
        disable=not progress or not todo,
        dynamic_ncols=True,
    )

    def work(item: Item) -> None:
        path = target.staged(item.name)
        md5 = None
        if item.state != "upload":
            claim = functools.partial(target.claim, item.name, item.remote)
            md5 = download(item.remote, path, stop, bar.update, retries, timeout, claim)
        target.commit(item.name, path, item.remote, md5)

    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="fetch")
    futures: dict[Future, Item] = {}
    settled: set[Future] = set()
    try:
        for item in todo:  # the first downloads start while the rest are submitted
            futures[pool.submit(work, item)] = item
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                settled.add(future)
                outcome.add(futures[future], future, target, stop)
            if stop.is_set():
                for future in pending:
                    future.cancel()
    except KeyboardInterrupt:
        outcome.interrupted = True
        stop.set()
        # said at once: the workers may be waiting on a slow server for their next chunk
        tqdm.write(INTERRUPTING, file=sys.stderr)
        for future in futures:
            future.cancel()
    finally:
        pool.shutdown(wait=True)  # running workers stop at their next chunk
        bar.close()
    for future, item in futures.items():  # those the loop did not reach
        if future not in settled:
            outcome.add(item, future, target, stop)
    outcome.not_started += todo[len(futures) :]  # interrupted before they were submitted
    return outcome
