"""Downloads into a target (a local directory or an s3:// prefix): resumable, verified, in parallel.

A file is written to `NAME.fetching` (with `NAME.fetching.json` saying which server file it is a part of),
resumed from its length with a range request, checked (size; MD5 where the ETag is one, as S3 gives for
single-part objects) and only then renamed to NAME, so a file under its final name is always complete. A
local target keeps `.fetch-manifest.json` (url, size, ETag of each file it wrote): a rerun skips what is
there and unchanged on the server, refetches what changed, and never touches a file it did not write. An
s3 target stages each file in a local directory, uploads it with boto3's transfer manager (multipart,
parallel parts; the object appears whole or not at all) and records url/size/ETag in the object's metadata.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..output import remove_partials, write_file
from .errors import FetchError
from .plan import Probed, local_name
from .remote import Changed, NotFound, RemoteFile, Transient, open_from

__all__ = [
    "INTERRUPTING",
    "MANIFEST",
    "PART",
    "Item",
    "LocalTarget",
    "Outcome",
    "S3Target",
    "download",
    "human",
    "fetch_items",
    "make_target",
    "plan_items",
]

PART = ".fetching"
INTERRUPTING = "interrupted: each download stops at its next chunk, its part kept for the next run"
MANIFEST = ".fetch-manifest.json"

# Item states: what a run does with the file.
TO_FETCH = ("fetch", "resume", "stale", "upload")


class Interrupted(FetchError):
    """Stopped by SIGINT or by another file's fatal error (a full disk)."""


class Corrupt(FetchError):
    """The downloaded bytes do not match the server's checksum."""


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _md5_etag(etag: str | None) -> str | None:
    """The MD5 an ETag stands for, when it is one (S3 single-part objects and many static servers)."""
    value = (etag or "").strip('"')
    return value if re.fullmatch(r"[0-9a-f]{32}", value) else None


def _write_json(path: Path, value: Any) -> None:
    write_file(path, json.dumps(value, indent=1, sort_keys=True))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _record(remote: RemoteFile) -> dict[str, Any]:
    return {"url": remote.url, "size": remote.size, "etag": remote.etag}


def part_length(dest: Path, remote: RemoteFile) -> int:
    """Bytes of `dest`'s partial download that can be resumed for `remote` (0: none, or of another version)."""
    part = dest.with_name(dest.name + PART)
    if part.is_file() and _read_json(part.with_name(part.name + ".json")) == _record(remote):
        return min(part.stat().st_size, remote.size)
    return 0


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
    _write_json(meta, _record(remote))
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
class Item:
    probed: Probed
    name: str
    """Path of the copy under the target (`local_name` of the URL)."""
    state: str
    """done (copy verified and current), fetch, resume (a partial copy), stale (the server's file changed
    since the copy was made), upload (downloaded, not yet uploaded), missing (not on the server),
    conflict (a file this tool did not write is in the way)."""
    have: int = 0
    """Bytes already at the target (done) or in a partial download."""

    @property
    def url(self) -> str:
        return self.probed.source.url

    @property
    def remote(self) -> RemoteFile:
        assert self.probed.remote is not None
        return self.probed.remote

    @property
    def todo(self) -> int:
        return self.remote.size - self.have if self.state in ("fetch", "resume", "stale") else 0


class LocalTarget:
    """A local directory; `.fetch-manifest.json` records what this tool wrote there."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self._lock = threading.Lock()
        manifest = self.root / MANIFEST
        remove_partials(manifest)  # of a run killed while writing it
        self.manifest: dict[str, Any] = {"version": 1, "files": {}, "configs": []}
        if manifest.exists():
            loaded = _read_json(manifest)
            if not isinstance(loaded, dict) or not isinstance(loaded.get("files"), dict):
                raise FetchError(f"{manifest} is not a fetch manifest: move it away, or choose another --to")
            self.manifest.update(loaded)

    def __str__(self) -> str:
        return str(self.root)

    def location(self, name: str) -> str:
        return str(self.root / name)

    def staged(self, name: str) -> Path:
        return self.root / name

    def inspect(self, name: str, remote: RemoteFile) -> tuple[str, int]:
        path = self.root / name
        if path.exists() or path.is_symlink():
            record = self.manifest["files"].get(name)
            if record is None or record.get("url") != remote.url or not path.is_file():
                return "conflict", 0
            if path.stat().st_size == record["size"] and (record["size"], record["etag"]) == (
                remote.size,
                remote.etag,
            ):
                return "done", remote.size
            return "stale", part_length(path, remote)
        have = part_length(path, remote)
        return ("resume" if have else "fetch"), have

    def has_copy(self, name: str) -> bool:
        """A verified copy (from an earlier run) of a file the server no longer has."""
        record = self.manifest["files"].get(name)
        path = self.root / name
        return record is not None and path.is_file() and path.stat().st_size == record["size"]

    def _existing_parent(self) -> Path:
        path = self.root
        while not path.exists():
            path = path.parent
        return path

    def free_bytes(self) -> int:
        return shutil.disk_usage(self._existing_parent()).free

    def check(self, items: list[Item], jobs: int) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise FetchError(f"--to {self.root} is a file, not a directory: choose a directory")
        parent = self._existing_parent()
        if not os.access(parent, os.W_OK | os.X_OK):
            raise FetchError(f"--to {self.root}: {parent} is not writable; choose another --to")
        need = sum(i.todo for i in items)
        if need > (free := self.free_bytes()):
            raise FetchError(
                f"--to {self.root}: {human(need)} to download but only {human(free)} free there; free some "
                "space or choose another --to"
            )

    def config_conflict(self, filename: str) -> str | None:
        path = self.root / filename
        if path.exists() and filename not in self.manifest["configs"]:
            return str(path)
        return None

    def claim(self, name: str, remote: RemoteFile, md5: str | None) -> None:
        """Record `name` in the manifest before the verified download takes that name: a run killed in
        between leaves a file the rerun knows as its own (and a partial one it resumes), never a conflict."""
        with self._lock:
            self.manifest["files"][name] = {**_record(remote), "md5": md5}
            self.root.mkdir(parents=True, exist_ok=True)
            _write_json(self.root / MANIFEST, self.manifest)

    def commit(self, name: str, path: Path, remote: RemoteFile, md5: str | None) -> None:
        """Nothing left: `claim` recorded the file, `download` gave it its name."""

    def write_config(self, filename: str, text: str) -> list[str]:
        """Write the config (a rerun that would write the same text leaves the file as it is)."""
        path = self.root / filename
        remove_partials(path)
        if not (path.is_file() and path.read_bytes() == text.encode()):
            write_file(path, text)
        with self._lock:
            if filename not in self.manifest["configs"]:
                self.manifest["configs"].append(filename)
                _write_json(self.root / MANIFEST, self.manifest)
        return [str(path)]


class S3Target:
    """An s3:// prefix, with downloads staged in a local directory and uploaded with boto3."""

    def __init__(self, url: str, staging: Path) -> None:
        parsed = urlparse(url)
        if not parsed.netloc:
            raise FetchError(f"--to {url}: no bucket; use --to s3://BUCKET/PREFIX")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.staging = staging.expanduser().absolute()
        import boto3

        self.client = boto3.client("s3")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def location(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def staged(self, name: str) -> Path:
        return self.staging / name

    def _head(self, key: str) -> dict[str, Any] | None:
        import botocore.exceptions

        try:
            return self.client.head_object(Bucket=self.bucket, Key=key)
        except botocore.exceptions.ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise FetchError(f"--to {self}: cannot read s3://{self.bucket}/{key} ({e})") from None

    def inspect(self, name: str, remote: RemoteFile) -> tuple[str, int]:
        head = self._head(self.key(name))
        staged = self.staged(name)
        if head is not None:
            meta = head.get("Metadata", {})
            if meta.get("fetch-url") != remote.url:
                return "conflict", 0
            if (int(head["ContentLength"]), meta.get("fetch-etag", "")) == (remote.size, remote.etag or ""):
                return "done", remote.size
            return "stale", part_length(staged, remote)
        if staged.is_file() and (_read_json(staged.with_name(staged.name + ".json")) == _record(remote)):
            return "upload", remote.size
        have = part_length(staged, remote)
        return ("resume" if have else "fetch"), have

    def has_copy(self, name: str) -> bool:
        head = self._head(self.key(name))
        return head is not None and "fetch-url" in head.get("Metadata", {})

    def free_bytes(self) -> int:
        path = self.staging
        while not path.exists():
            path = path.parent
        return shutil.disk_usage(path).free

    def check(self, items: list[Item], jobs: int) -> None:
        import botocore.exceptions

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise FetchError(
                f"--to {self}: bucket {self.bucket} not reachable ({e}); check the name, credentials and "
                "AWS_ENDPOINT_URL"
            ) from None
        # Each worker stages at most one file at a time.
        need = sum(sorted((i.todo for i in items), reverse=True)[:jobs])
        if need > (free := self.free_bytes()):
            raise FetchError(
                f"--staging {self.staging}: {human(need)} needed to stage {jobs} file(s) at a time but only "
                f"{human(free)} free; choose another --staging or fewer --jobs"
            )

    def config_conflict(self, filename: str) -> str | None:
        head = self._head(self.key(filename))
        if head is not None and "fetch-config" not in head.get("Metadata", {}):
            return self.location(filename)
        return None

    def claim(self, name: str, remote: RemoteFile, md5: str | None) -> None:
        """Nothing to record locally: the object's metadata says it is this tool's (`commit`)."""

    def commit(self, name: str, path: Path, remote: RemoteFile, md5: str | None) -> None:
        """Upload the staged download with its url/size/ETag as metadata, check it arrived whole, then
        remove the staged copy."""
        from boto3.s3.transfer import TransferConfig

        metadata = {"fetch-url": remote.url, "fetch-size": str(remote.size), "fetch-etag": remote.etag or ""}
        config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)
        key = self.key(name)
        self.client.upload_file(str(path), self.bucket, key, ExtraArgs={"Metadata": metadata}, Config=config)
        head = self._head(key)
        if head is None or int(head["ContentLength"]) != remote.size:
            raise FetchError(f"{self.location(name)}: upload did not arrive whole; rerun")
        path.unlink()  # the staged copy (ours); the bucket has it now
        path.with_name(path.name + ".json").unlink(missing_ok=True)

    def write_config(self, filename: str, text: str) -> list[str]:
        local = write_file(self.staging / filename, text)
        self.client.put_object(
            Bucket=self.bucket, Key=self.key(filename), Body=text.encode(), Metadata={"fetch-config": "1"}
        )
        return [str(local), self.location(filename)]


def make_target(to: str, staging: str | None) -> LocalTarget | S3Target:
    """The `--to` target. s3 targets stage downloads under `staging` (default: ~/.cache/olmo-repo/fetch)."""
    scheme = urlparse(to).scheme
    if scheme == "s3":
        parsed = urlparse(to)
        default = Path.home() / ".cache/olmo-repo/fetch" / parsed.netloc / parsed.path.strip("/")
        return S3Target(to, Path(staging) if staging else default)
    if scheme:
        raise FetchError(
            f"--to {to}: {scheme}:// is not a supported target; use a directory or s3://BUCKET/PREFIX"
        )
    return LocalTarget(Path(to))


def plan_items(probed: list[Probed], target: LocalTarget | S3Target) -> list[Item]:
    """What to do with each probed source at this target. The same URL twice (a config may list a file
    twice) is one item."""
    items: list[Item] = []
    seen: set[str] = set()
    for p in probed:
        if p.source.url in seen:
            continue
        seen.add(p.source.url)
        name = local_name(p.source.url)
        if p.remote is None:
            items.append(Item(p, name, "kept" if target.has_copy(name) else "missing"))
        else:
            state, have = target.inspect(name, p.remote)
            items.append(Item(p, name, state, have))
    return items


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
