"""The documents `scripts/prepare_data.py` reads: input paths resolved to files, and every record checked before
anything is written (`olmo_repo.fetch.prepare`).

An input is a local or `s3://` file, folder (every file under it) or glob; a file is jsonl (`.jsonl`,
`.jsonl.gz`, `.jsonl.zst`; `.json` and `.ndjson` too: one JSON object a line) or parquet (`.parquet`), one
document per record, its text in the field `text`. datatrove's readers read them in the run, and skip a record
without text or a line that is not JSON with a warning in a log; here such a record stops the command instead, in
one line naming the file and the record, before any token is written: a corpus that is not what the user thinks
is said at once, not found later as missing documents. Reads through fsspec (s3fs for s3://).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import RepoError

__all__ = ["JSONL_SUFFIXES", "PARQUET_SUFFIXES", "Inputs", "common_root", "record_problem", "resolve_inputs"]

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
        unstrip = fs.unstrip_protocol if "://" in given else (lambda p: p)
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


def record_problem(url: str) -> str | None:
    """What is wrong with a file's records, in a few words naming the first bad one, or None: a line that is
    not a JSON object, bytes that are not UTF-8, a record whose `text` is missing or not a string. Reads the whole
    file (decompressed as datatrove decompresses it, from its suffix)."""
    return _parquet_problem(url) if _kind(url) == "parquet" else _jsonl_problem(url)


def _jsonl_problem(url: str) -> str | None:
    import io

    import fsspec
    import orjson

    with fsspec.open(url, "rb", compression="infer") as f:
        # zstd's stream reads but has no readline: a buffer gives lines of any stream
        for number, line in enumerate(io.BufferedReader(f), start=1):
            if not line.strip():
                continue
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"{url}: line {number} is not UTF-8 ({e.reason} at byte {e.start})"
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                return f"{url}: line {number} is not a JSON object ({e})"
            if problem := _text_problem(record):
                return f"{url}: line {number} {problem}"
    return None


def _parquet_problem(url: str) -> str | None:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as f:
        try:
            table = pq.ParquetFile(f)
        except pa.ArrowException as e:
            return f"{url} is not a parquet file ({e})"
        if TEXT not in table.schema_arrow.names:
            return f"{url} has no column {TEXT!r} (columns: {', '.join(table.schema_arrow.names)})"
        kind = table.schema_arrow.field(TEXT).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return f"{url}: column {TEXT!r} is {kind}, not text"
        row = 0
        try:
            for batch in table.iter_batches(columns=[TEXT], batch_size=4096):
                column = batch.column(0)
                if column.null_count:
                    first = column.is_null().to_pylist().index(True)
                    return f"{url}: record {row + first + 1} has no {TEXT!r} (null)"
                column.validate(full=True)  # a string column's bytes are UTF-8
                row += len(column)
        except pa.ArrowException as e:
            return f"{url}: a record after row {row} is not UTF-8 text ({e})"
    return None


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
    scheme = files[0].split("://", 1)[0] + "://" if "://" in files[0] else ""
    if any(("://" in f) != bool(scheme) or not f.startswith(scheme) for f in files):
        raise RepoError("the inputs of one source are all local files or all under one URL scheme (s3://)")
    return scheme + os.path.commonpath([os.path.dirname(f[len(scheme) :]) for f in files])
