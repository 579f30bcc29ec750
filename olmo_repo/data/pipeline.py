"""The steps of `olmo_repo.data.prepare`'s datatrove pipeline that are this project's (around datatrove's readers and
`olmo_repo.upstream.datatrove.ModelTokenizer`), and how a run shows on the terminal: datatrove's log lines into a
file, a progress bar of tokens on the terminal."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..terminal import QuietStream
from .folder import STATE, shard_documents_name
from .store import open_folder, read_json, write_whole

if TYPE_CHECKING:
    from datatrove.io import DataFolder

__all__ = ["Shifted", "TaskShards", "TaskStart", "progress", "stderr_to"]


@contextlib.contextmanager
def stderr_to(log: Path) -> Iterator[Any]:
    """File descriptor 2 of this process and the workers it starts into `log` (datatrove's per-task log lines);
    yields a stream to the terminal's stderr for the progress bar. Restored on exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = QuietStream(os.fdopen(os.dup(saved), "w", buffering=1))
    with open(log, "a") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield terminal
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        terminal.close()


@contextlib.contextmanager
def progress(out: DataFolder, work: Path, ranks: range, terminal: Any, enabled: bool) -> Iterator[None]:
    """A progress bar of tokens (and tokens/s) over this machine's tasks, from what they have written: the
    unshuffled token files growing in the working folder (4 bytes an id) and the shards of the tasks done."""
    from tqdm import tqdm

    stop = threading.Event()

    done: dict[str, int] = {}  # a finished task's record -> its tokens (read once; one listing a poll)
    mine = {f"{r:05d}.json" for r in ranks}

    def tokens() -> int:
        records = (
            {Path(p).name for p in out.ls(f"{STATE}/shards", detail=False)}
            if out.exists(f"{STATE}/shards")
            else set()
        )
        for name in (records & mine) - done.keys():
            done[name] = sum(s["tokens"] for s in read_json(out, f"{STATE}/shards/{name}"))
        growing = sum(p.stat().st_size for r in ranks for p in work.glob(f"{r:05d}_unshuffled.ds")) // 4
        return sum(done.values()) + growing

    def poll() -> None:
        start = tokens()
        with tqdm(desc="tokenising", unit="tok", unit_scale=True, file=terminal, disable=not enabled) as bar:
            while not stop.wait(1.0):
                with contextlib.suppress(OSError, ValueError):
                    bar.update(max(0, tokens() - start - bar.n))
            with contextlib.suppress(OSError, ValueError):
                bar.update(max(0, tokens() - start - bar.n))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Shifted:
    """A reader that takes files[(rank - shift)::world_size] of its list: the second reader of a task continues the
    first's numbering, so that task r reads files r, r + tasks, ... of the jsonl and parquet files as one list."""

    def __init__(self, reader: Any, shift: int) -> None:
        self.reader, self.shift = reader, shift

    def __call__(self, data: Any, rank: int = 0, world_size: int = 1) -> Any:
        return self.reader(data, (rank - self.shift) % world_size, world_size)

    def __repr__(self) -> str:
        return repr(self.reader)


class TaskStart:
    """The first step of a task: what an earlier, killed attempt of the same task left is removed (its shards,
    its record, its working files), so that the task writes from nothing."""

    def __init__(self, output: str, work: str) -> None:
        self.output, self.work = output, work

    def __call__(self, data: Any, rank: int = 0, world_size: int = 1) -> Any:
        out = open_folder(self.output)
        for pattern in (f"part-{rank:05d}-*", f"{rank:05d}_*"):
            for name in out.list_files(glob_pattern=pattern, recursive=False):
                out.rm_file(name)
        if out.isfile(record := f"{STATE}/shards/{rank:05d}.json"):
            out.rm_file(record)
        for path in Path(self.work).glob(f"{rank:05d}_*"):
            path.unlink()
        return data


class TaskShards:
    """The last step of a task: each shard datatrove wrote (`NNNNN_SSSSS_doc_shuffled.ds` and its `.index` of
    document ends) becomes `part-NNNNN-SSSSS.npy` with its documents' offsets (`.csv.gz`, written first), and the
    task's record lists them (written last). datatrove opens a new shard whenever the running total passes
    `max_tokens_per_file` after a document, the task's last one included: that shard stays empty, and is removed
    (the parts are numbered without it)."""

    def __init__(self, output: str) -> None:
        self.output = output

    def __call__(self, data: Any, rank: int = 0, world_size: int = 1) -> Any:
        import numpy as np

        from ..upstream.datatrove import shard_name

        out, shards, sub = open_folder(self.output), [], 0
        while out.isfile(name := shard_name(rank, sub)):
            sub += 1
            with out.open(f"{name}.index", "rb") as f:
                ends = np.frombuffer(f.read(), dtype="<u8")  # [documents] cumulative token ends
            tokens = int(ends[-1]) if len(ends) else 0
            if out.size(name) != 4 * tokens:
                raise RuntimeError(f"{name}: {out.size(name)} bytes for {tokens} tokens")
            if not tokens:
                out.rm_file(name)
                out.rm_file(f"{name}.index")
                continue
            part = f"part-{rank:05d}-{len(shards):05d}.npy"
            starts = np.concatenate([np.zeros(1, dtype=ends.dtype), ends[:-1]])  # uint64: no float
            rows = "".join(f"{s},{e}\n" for s, e in zip(starts.tolist(), ends.tolist()))
            out.pipe_file(shard_documents_name(part), gzip.compress(rows.encode(), mtime=0))
            out.mv(name, part)
            out.rm_file(f"{name}.index")
            shards.append({"path": part, "tokens": tokens, "documents": len(ends)})
        write_whole(out, f"{STATE}/shards/{rank:05d}.json", json.dumps(shards))
        return data
