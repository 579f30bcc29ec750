"""Corpus files for the tests of scripts/prepare_data.py (tests/prepared_data.py): each in the format its suffix
names (.jsonl, .jsonl.gz, .jsonl.zst, .parquet; any other: jsonl lines as they are). A record given as
{"raw": "HEX"} is that line's bytes as they are (a line that is not UTF-8, or not JSON). Run as a script (by
`.venv-data/bin/python`, which has zstandard) it writes the files of {path: [record, ...]} on stdin."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def _line(record: dict) -> bytes:
    return (
        bytes.fromhex(record["raw"]) + b"\n"
        if set(record) == {"raw"}
        else (json.dumps(record) + "\n").encode()
    )


def write(path: Path, records: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
        return
    data = b"".join(_line(r) for r in records)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


if __name__ == "__main__":
    for name, records in json.load(sys.stdin).items():
        write(Path(name), records)
