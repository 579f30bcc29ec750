"""Reading remote files: size and ETag (`stat`), a byte stream from an offset (`open_from`), listing (`list_s3`).

http(s) goes through `requests` (HEAD for Content-Length/ETag, GET with `Range: bytes=N-` and `If-Range` to
resume), s3:// through boto3 (`head_object`, `get_object` with `Range` and `IfMatch`). Both are what ai2-olmo
itself reads these URLs with, so a file fetched here is the file the trainer would have streamed. Errors are
sorted into the few kinds the fetch acts on: not found, changed on the server, transient (retry), other.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import requests

from .errors import FetchError

__all__ = [
    "CHUNK",
    "Changed",
    "NotFound",
    "RemoteFile",
    "Transient",
    "list_s3",
    "open_from",
    "scheme",
    "stat",
]

CHUNK = 1 << 18
"""Bytes per read and write: at most this much is lost when a connection drops; SIGINT stops a file within one
chunk; large enough that Python's per-chunk cost is negligible."""

SCHEMES = ("http", "https", "s3")


class NotFound(FetchError):
    """The server has no such file (HTTP 404/410, S3 NoSuchKey)."""


class Changed(FetchError):
    """The file on the server is not the one planned: another size or ETag."""


class Transient(FetchError):
    """A dropped connection, a timeout or a server error: worth retrying from where the file stopped."""


@dataclass(frozen=True)
class RemoteFile:
    url: str
    size: int
    etag: str | None


def scheme(url: str) -> str:
    return urlparse(url).scheme


_local = threading.local()
_s3_lock = threading.Lock()
_s3_clients: dict[str | None, Any] = {}


def _session() -> requests.Session:
    # One session per thread: connection reuse across the many files of one server.
    if not hasattr(_local, "session"):
        _local.session = requests.Session()
    return _local.session


def _s3() -> Any:
    # boto3 clients are thread-safe; one per endpoint (AWS_ENDPOINT_URL may differ between calls in a process).
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    with _s3_lock:
        if endpoint not in _s3_clients:
            import boto3
            from botocore.config import Config

            _s3_clients[endpoint] = boto3.client("s3", config=Config(retries={"max_attempts": 3}))
        return _s3_clients[endpoint]


def _bucket_key(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    return parsed.netloc, parsed.path.lstrip("/")


def stat(url: str, timeout: float) -> RemoteFile:
    """Size and ETag of a remote file. Raises NotFound, Transient or FetchError."""
    if scheme(url) == "s3":
        bucket, key = _bucket_key(url)
        with _s3_errors(url):
            head = _s3().head_object(Bucket=bucket, Key=key)
        return RemoteFile(url, int(head["ContentLength"]), head.get("ETag"))
    try:
        response = _session().head(url, allow_redirects=True, timeout=timeout)
    except requests.RequestException as e:
        raise Transient(f"{url}: unreachable ({_reason(e)})") from None
    _check_status(url, response)
    length = response.headers.get("Content-Length")
    if length is None:
        # ai2-olmo needs it too: it sizes every data file with a HEAD request.
        raise FetchError(f"{url}: the server gives no Content-Length, so the copy could not be verified")
    return RemoteFile(url, int(length), response.headers.get("ETag"))


@contextmanager
def open_from(remote: RemoteFile, start: int, timeout: float) -> Iterator[tuple[int, Iterator[bytes]]]:
    """`(offset, chunks)`: the file's bytes from `offset`, which is `start` when the server resumes there and 0
    when it sends the whole file. Raises Changed when the server's file is not `remote` any more."""
    if scheme(remote.url) == "s3":
        bucket, key = _bucket_key(remote.url)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start:
            kwargs["Range"] = f"bytes={start}-"
        if remote.etag:
            kwargs["IfMatch"] = remote.etag
        with _s3_errors(remote.url):
            response = _s3().get_object(**kwargs)
        total = start + int(response["ContentLength"])
        if total != remote.size:
            raise Changed(f"{remote.url}: now {total:,} bytes, planned {remote.size:,}")
        body = response["Body"]
        try:
            yield start, _s3_chunks(remote.url, body)
        finally:
            body.close()
        return

    headers = {"Accept-Encoding": "identity"}  # the stored bytes, not a compressed transfer of them
    if start:
        headers["Range"] = f"bytes={start}-"
        if remote.etag:
            headers["If-Range"] = remote.etag  # a changed file comes back whole (200), not spliced
    try:
        response = _session().get(remote.url, headers=headers, stream=True, timeout=timeout)
    except requests.RequestException as e:
        raise Transient(f"{remote.url}: {_reason(e)}") from None
    try:
        if response.status_code == 416:
            raise Changed(
                f"{remote.url}: the server's file is shorter than the {start:,} bytes already fetched"
            )
        _check_status(remote.url, response)
        etag = response.headers.get("ETag")
        if remote.etag and etag and etag != remote.etag:
            raise Changed(f"{remote.url}: ETag is now {etag}, planned {remote.etag}")
        if response.status_code == 206:
            match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", response.headers.get("Content-Range", ""))
            if match is None:
                raise FetchError(
                    f"{remote.url}: unreadable Content-Range {response.headers.get('Content-Range')}"
                )
            offset, total = int(match[1]), match[3]
            if total != "*" and int(total) != remote.size:
                raise Changed(f"{remote.url}: now {int(total):,} bytes, planned {remote.size:,}")
        else:
            offset = 0
            length = response.headers.get("Content-Length")
            if length is not None and int(length) != remote.size:
                raise Changed(f"{remote.url}: now {int(length):,} bytes, planned {remote.size:,}")
        yield offset, _http_chunks(remote.url, response)
    finally:
        response.close()


def _http_chunks(url: str, response: requests.Response) -> Iterator[bytes]:
    try:
        yield from response.iter_content(CHUNK)
    except requests.RequestException as e:  # dropped mid-file: urllib3 checks Content-Length
        raise Transient(f"{url}: {_reason(e)}") from None


def _s3_chunks(url: str, body: Any) -> Iterator[bytes]:
    import botocore.exceptions
    import urllib3.exceptions

    try:
        yield from body.iter_chunks(CHUNK)
    except (botocore.exceptions.BotoCoreError, urllib3.exceptions.HTTPError, OSError) as e:
        raise Transient(f"{url}: {e}") from None


def list_s3(url: str) -> list[RemoteFile]:
    """Every object under an s3:// prefix (a directory: the prefix ends with '/')."""
    bucket, key = _bucket_key(url.rstrip("/") + "/")
    files = []
    with _s3_errors(url):
        for page in _s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for obj in page.get("Contents", []):
                files.append(RemoteFile(f"s3://{bucket}/{obj['Key']}", int(obj["Size"]), obj.get("ETag")))
    return files


@contextmanager
def _s3_errors(url: str) -> Iterator[None]:
    import botocore.exceptions

    try:
        yield
    except botocore.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchKey", "NotFound") or status == 404:
            raise NotFound(f"{url}: not found") from None
        if code in ("412", "PreconditionFailed", "InvalidRange") or status in (412, 416):
            raise Changed(f"{url}: changed on the server ({code})") from None
        if status is not None and status >= 500:
            raise Transient(f"{url}: {code or status}") from None
        raise FetchError(f"{url}: {code} ({e})") from None
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionError) as e:
        raise Transient(f"{url}: unreachable ({e})") from None
    except botocore.exceptions.NoCredentialsError:
        raise FetchError(f"{url}: no AWS credentials (set AWS_ACCESS_KEY_ID/AWS_PROFILE)") from None


def _check_status(url: str, response: requests.Response) -> None:
    if response.status_code in (404, 410):
        raise NotFound(f"{url}: not found (HTTP {response.status_code})")
    if response.status_code >= 500 or response.status_code == 429:
        raise Transient(f"{url}: HTTP {response.status_code}")
    if response.status_code >= 400:
        raise FetchError(f"{url}: HTTP {response.status_code} {response.reason}")


def _reason(e: Exception) -> str:
    # requests nests the useful part (connection refused, read timed out) deep in its message.
    text = str(e)
    for pattern in (
        r"\[Errno -?\d+\] [^')\"]+",
        r"Read timed out",
        r"IncompleteRead\([^)]*\)",
        r"Connection aborted",
    ):
        if m := re.search(pattern, text):
            return m[0]
    return type(e).__name__
