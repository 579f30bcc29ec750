"""The documents `scripts/prepare_data.py` reads: input paths resolved to files, and every record checked before
anything is written (`olmo_repo.data.prepare`).

An input is a local or `s3://` file, folder (every file under it) or glob; a file is jsonl (`.jsonl`,
`.jsonl.gz`, `.jsonl.zst`; `.json` and `.ndjson` too: one JSON object a line) or parquet (`.parquet`), one
document per record, its text in the field `text`. datatrove's readers read them in the run, and skip a record
without text or a line that is not JSON with a warning in a log; here such a record stops the command instead, in
one line naming the file and the record, before any token is written: a corpus that is not what the user thinks
is said at once, not found later as missing documents. Reads through fsspec (s3fs for s3://).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

from ..errors import RepoError
from ..paths import is_url

__all__ = [
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "Inputs",
    "Records",
    "common_root",
    "read_records",
    "resolve_inputs",
]

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
_JSONL, _PARQUET = "jsonl (.jsonl, .jsonl.gz, .jsonl.zst)", "parquet (.parquet)"
TEXT = "text"


@dataclass(frozen=True)
class Inputs:
    """The input files of one source, resolved and sorted (full paths or URLs), and their bytes on disk."""

    jsonl: tuple[str, ...]
    parquet: tuple[str, ...]
    size: int

    @property
    def files(self) -> tuple[str, ...]:
        return self.jsonl + self.parquet


def _kind(path: str) -> str | None:
    name = path.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "parquet" if name.endswith(PARQUET_SUFFIXES) else None


def resolve_inputs(inputs: list[str], flag: str = "input") -> Inputs:
    """Every file the inputs name (a file, a folder's files of a known kind, a glob's matches); `RepoError` for a
    missing input, a folder or glob with no such file, a file of another kind, or an empty file."""
    from fsspec.core import url_to_fs

    jsonl, parquet, size = set(), set(), 0
    for given in inputs:
        fs, path = url_to_fs(given)
        unstrip = fs.unstrip_protocol if is_url(given) else (lambda p: p)
        if any(c in path for c in "*?["):
            found = {p: fs.info(p) for p in fs.glob(path)}
            if not found:
                raise RepoError(f"{flag} {given} matches no file")
        elif not fs.exists(path):
            raise RepoError(f"{flag} {given} does not exist")
        elif fs.isdir(path):
            found = {p: info for p, info in fs.find(path, detail=True).items() if _kind(p)}
            if not found:
                raise RepoError(f"{flag} {given} is a folder with no {_JSONL} or {_PARQUET} file")
        else:
            found = {path: fs.info(path)}
        for name, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            kind = _kind(name)
            if kind is None:
                raise RepoError(f"{flag} {unstrip(name)} is neither {_JSONL} nor {_PARQUET}")
            if not info.get("size"):
                raise RepoError(f"{flag} {unstrip(name)} is empty")
            (jsonl if kind == "jsonl" else parquet).add(unstrip(name))
            size += info["size"]
    return Inputs(tuple(sorted(jsonl)), tuple(sorted(parquet)), size)


class Records(NamedTuple):
    """What reading a file's records found: the first problem (a few words naming it), or None, and how many
    documents it holds (records whose text is not empty: datatrove's readers skip the others)."""

    problem: str | None
    documents: int


def read_records(url: str) -> Records:
    """Every record of a file, as datatrove will read it (decompressed by its suffix): a line that is not a JSON
    object, bytes that are not UTF-8, a record whose `text` is missing or not a string, a compressed stream cut
    short ("truncated") or corrupt, and the documents it holds."""
    return _parquet_records(url) if _kind(url) == "parquet" else _jsonl_records(url)


def _jsonl_records(url: str) -> Records:
    import fsspec
    import orjson

    documents = 0
    with fsspec.open(url, "rb") as raw:
        try:
            for number, line in enumerate(_lines(raw, url), start=1):
                if not line.strip():
                    continue
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    return Records(
                        f"{url}: line {number} is not UTF-8 ({e.reason} at byte {e.start})", documents
                    )
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    return Records(f"{url}: line {number} is not a JSON object ({e})", documents)
                if problem := _text_problem(record):
                    return Records(f"{url}: line {number} {problem}", documents)
                documents += bool(record[TEXT])
        except EOFError:
            return Records(f"{url} is truncated: its compressed stream ends before its end marker", documents)
        except _CorruptStream as e:
            return Records(f"{url} is not a readable {e.args[0]} file ({e.__cause__})", documents)
    return Records(None, documents)


class _CorruptStream(Exception):
    """A compressed stream that does not decompress; args[0] names its format, the cause says why."""


def _lines(raw: BinaryIO, url: str) -> Iterator[bytes]:
    """The lines of a jsonl file's bytes, decompressed by its suffix (.gz, .zst). EOFError where a compressed
    stream ends before its end marker (a file cut short); `_CorruptStream` where it does not decompress."""
    import gzip
    import zlib

    if url.endswith(".gz"):
        with gzip.GzipFile(fileobj=raw) as f:
            try:
                yield from f
            except (gzip.BadGzipFile, zlib.error) as e:
                raise _CorruptStream("gzip") from e
    elif url.endswith(".zst"):
        import zstandard

        try:
            yield from _split_lines(_zstd_chunks(raw))
        except zstandard.ZstdError as e:
            raise _CorruptStream("zstd") from e
    else:
        yield from raw


def _zstd_chunks(raw: BinaryIO) -> Iterator[bytes]:
    """The decompressed bytes of every zstd frame of `raw`, in chunks; EOFError where the last frame is not whole
    (zstandard's stream reader returns a cut frame's bytes without a word)."""
    import zstandard

    frame, fed = zstandard.ZstdDecompressor().decompressobj(), False
    while chunk := raw.read(1 << 20):
        while chunk:
            yield frame.decompress(chunk)
            fed, chunk = True, b""
            if frame.eof:  # the next frame may start in this chunk
                chunk, frame, fed = frame.unused_data, zstandard.ZstdDecompressor().decompressobj(), False
    if fed:
        raise EOFError("a zstd frame is cut short")


def _split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
    if rest:
        yield rest


def _parquet_records(url: str) -> Records:
    import fsspec
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as f:
        try:
            table = pq.ParquetFile(f)
        except pa.ArrowException as e:
            f.seek(0)
            if f.read(4) == b"PAR1":  # a parquet file's first bytes, and its last: a file cut short lost them
                return Records(f"{url} is truncated: its parquet footer is missing", 0)
            return Records(f"{url} is not a parquet file ({e})", 0)
        if TEXT not in table.schema_arrow.names:
            return Records(
                f"{url} has no column {TEXT!r} (columns: {', '.join(table.schema_arrow.names)})", 0
            )
        kind = table.schema_arrow.field(TEXT).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return Records(f"{url}: column {TEXT!r} is {kind}, not text", 0)
        row = documents = 0
        try:
            for batch in table.iter_batches(columns=[TEXT], batch_size=4096):
                column = batch.column(0)
                if column.null_count:
                    first = column.is_null().to_pylist().index(True)
                    return Records(f"{url}: record {row + first + 1} has no {TEXT!r} (null)", 0)
                column.validate(full=True)  # a string column's bytes are UTF-8
                row += len(column)
                documents += pc.sum(pc.greater(pc.binary_length(column), 0)).as_py() or 0
        except pa.ArrowException as e:
            return Records(f"{url}: a record after row {row} is not UTF-8 text ({e})", 0)
    return Records(None, documents)


def _text_problem(record: object) -> str | None:
    if not isinstance(record, dict):
        return f"is not a JSON object ({type(record).__name__})"
    if TEXT not in record:
        keys = ", ".join(list(record)[:5])
        return f"has no {TEXT!r} field (fields: {keys})"
    if not isinstance(record[TEXT], str):
        return f"has a {TEXT!r} that is not a string ({type(record[TEXT]).__name__})"
    return None


def common_root(files: tuple[str, ...]) -> str:
    """The folder (or URL prefix) every file lies under: datatrove's readers take paths relative to one."""
    scheme = files[0].split("://", 1)[0] + "://" if is_url(files[0]) else ""
    if any(is_url(f) != bool(scheme) or not f.startswith(scheme) for f in files):
        raise RepoError("the inputs of one source are all local files or all under one URL scheme (s3://)")
    return scheme + os.path.commonpath([os.path.dirname(f[len(scheme) :]) for f in files])
