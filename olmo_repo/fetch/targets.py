"""Where `scripts/fetch.py` puts its copies, and what each copy needs there: a local directory (`LocalTarget`,
whose `.fetch-manifest.json` records url, size and ETag of each file this tool wrote: a rerun skips what is there
and unchanged on the server, refetches what changed, and never touches a file it did not write) or an s3:// prefix
(`S3Target`: downloads staged in a local directory, uploaded with boto3's transfer manager, url/size/ETag in the
object's metadata); `plan_items` says what each probed source needs at a target (`Item.state`). A partial download
is `NAME.fetching` beside `NAME.fetching.json`, which says which server file it is a part of (`part_length`)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..output import remove_partials, write_file
from .errors import FetchError
from .plan import Probed, local_name
from .remote import RemoteFile

__all__ = [
    "MANIFEST",
    "PART",
    "TO_FETCH",
    "Item",
    "LocalTarget",
    "S3Target",
    "file_record",
    "human",
    "make_target",
    "part_length",
    "plan_items",
    "write_json",
]

PART = ".fetching"
"""The suffix of a partial download (`NAME.fetching`, its record `NAME.fetching.json`)."""
MANIFEST = ".fetch-manifest.json"

TO_FETCH = ("fetch", "resume", "stale", "upload")
"""The `Item.state`s of a file a run transfers."""


def human(n: float) -> str:
    """A byte count for people: `1.5 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def write_json(path: Path, value: Any) -> None:
    """`value` as `path` (indented, keys sorted), written whole or not at all (`output.write_file`)."""
    write_file(path, json.dumps(value, indent=1, sort_keys=True))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def file_record(remote: RemoteFile) -> dict[str, Any]:
    """What a copy records of its server file (a manifest entry, a partial download's `.json`): url, size, ETag."""
    return {"url": remote.url, "size": remote.size, "etag": remote.etag}


def part_length(dest: Path, remote: RemoteFile) -> int:
    """Bytes of `dest`'s partial download that can be resumed for `remote` (0: none, or of another version)."""
    part = dest.with_name(dest.name + PART)
    if part.is_file() and _read_json(part.with_name(part.name + ".json")) == file_record(remote):
        return min(part.stat().st_size, remote.size)
    return 0


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
            self.manifest["files"][name] = {**file_record(remote), "md5": md5}
            self.root.mkdir(parents=True, exist_ok=True)
            write_json(self.root / MANIFEST, self.manifest)

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
                write_json(self.root / MANIFEST, self.manifest)
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
        if staged.is_file() and (_read_json(staged.with_name(staged.name + ".json")) == file_record(remote)):
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
