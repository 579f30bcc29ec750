"""A run's data from real corpora (`scripts/prepare_data.py`): documents read, tokenised with the model's own
tokenizer and written as token shards by datatrove, on every core and, past one machine, on N machines that each
write their part of the same folder; one step then checks the parts and joins them (`data.json`). The folder's
layout is `olmo_repo.data.folder`'s; docs/data.md says why datatrove, and what it measured.

How a folder is made (OUTPUT is a local folder or an s3:// URL):

1. Checks, before anything is written: the model's tokenizer.json reads with the `tokenizers` package and its end
   id is a token; every input resolves to jsonl or parquet files that are not empty, and every record of the files
   still to do is a JSON object (or parquet row) with a string `text`, in UTF-8 (`olmo_repo.data.inputs`, on every
   core); OUTPUT is new, or this command's folder made with the same settings (a rerun continues it; other
   settings are refused, naming the first that differs).
2. OUTPUT/.prepare/ records the settings and the input lists, OUTPUT/tokenizer.json the tokenizer; then datatrove's
   `LocalPipelineExecutor` runs `tasks` tasks (by default one per input file; input file i goes to task i mod
   tasks), `workers` at a time (by default every core): each reads its files (datatrove's `JsonlReader`,
   `ParquetReader`), tokenises them (`olmo_repo.upstream.datatrove.ModelTokenizer`: uint32, the end id after each
   document, nothing truncated), shuffles its documents (seeded: the same input gives the same shards) and writes
   them in shards of at most `shard_tokens` tokens plus one document, which it then names `part-TASK-N.npy`, with
   the documents' offsets beside (`.csv.gz`) and its shards' record in .prepare/shards/. datatrove marks the task
   done; a killed run's rerun redoes only the tasks not done (a done task whose shard is missing or cut short is
   redone too).
3. The join (at the end of a run on one machine; `--join` after a run on several): every task done, every shard
   of the size its record states; then `data.json` is written, last and whole (`olmo_repo.output.write_file`;
   one PUT on S3): a folder without it is not a run's data, and the trainers' checks say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RepoError
from .folder import DATA_FORMAT, MANIFEST, STARTED, STATE, TOKENIZER, shard_documents_name
from .inputs import Inputs, common_root, read_records, resolve_inputs
from .pipeline import Shifted, TaskShards, TaskStart, progress, stderr_to
from .store import open_folder, read_json, write_whole
from .tokens import end_token_id, model_files

if TYPE_CHECKING:
    from datatrove.io import DataFolder

__all__ = [
    "SHARD_TOKENS",
    "STATE",
    "Model",
    "Plan",
    "Prepared",
    "Settings",
    "execute",
    "join",
    "model_tokenizer",
    "plan",
    "prepare",
]

SHARD_TOKENS = 1 << 29
"""Tokens per shard by default (2 GiB of uint32; a shard may exceed it by its last document)."""
SEED = 0  # datatrove's shuffle of each task's documents: the same input gives the same shards
_OURS = (MANIFEST, TOKENIZER, STATE)
# The shards and, while a task runs (or after it was killed), datatrove's names for them.
_OUR_FILE = re.compile(r"part-\d{5}-\d{5}\.(npy|csv\.gz)|\d{5}_\d{5}_doc_shuffled\.ds(\.index)?")


@dataclass(frozen=True)
class Model:
    """The tokenizer a folder is made with: its file, end id, vocabulary size and sha256 (recorded)."""

    tokenizer: Path
    eos_token_id: int
    vocab_size: int
    sha256: str


@dataclass(frozen=True)
class Settings:
    """What decides a folder's content: a rerun must repeat it (the workers and machines may differ)."""

    inputs: list[str]
    tokenizer_sha256: str
    eos_token_id: int
    shard_tokens: int
    tasks: int
    seed: int = SEED


@dataclass(frozen=True)
class Prepared:
    """A finished folder: where, its shards, tokens and documents (end ids included), its end id."""

    folder: str
    shards: int
    tokens: int
    documents: int
    eos_token_id: int

    def summary(self) -> str:
        return (
            f"wrote {self.folder}: {self.tokens:,} tokens of {self.documents:,} documents in {self.shards} "
            f"shard{'s' * (self.shards != 1)} (uint32, each document ended by id {self.eos_token_id})"
        )


def model_tokenizer(model: str | PathLike, eos_token_id: int | None = None) -> Model:
    """The tokenizer.json of `model` (an HF directory or an OLMo-core checkpoint, as tokenize_text.py takes it)
    and its end id (the model's unless given), read with the `tokenizers` package; `RepoError` in one line."""
    from tokenizers import Tokenizer

    tokenizer_file, config = model_files(Path(model))
    eos = end_token_id(config, model) if eos_token_id is None else eos_token_id
    try:
        vocab_size = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True)
    except Exception as e:  # the tokenizers package raises a plain Exception for a malformed file
        raise RepoError(f"{tokenizer_file} is not a readable tokenizer.json ({e})") from None
    if not 0 <= eos < vocab_size:
        raise RepoError(f"end id {eos} is not a token of {tokenizer_file} (ids 0..{vocab_size - 1})")
    digest = hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
    return Model(tokenizer_file, eos, vocab_size, digest)


def _check_output(out: DataFolder, settings: Settings) -> None:
    """OUTPUT is new, or this command's with the same settings; `RepoError` otherwise (nothing written)."""
    if not out.exists(""):
        return
    if not out.isdir(""):
        raise RepoError(f"--output {out.path} is a file, not a folder")
    names = sorted(Path(p.rstrip("/")).name for p in out.ls("", detail=False))
    foreign = [n for n in names if n not in _OURS and not _OUR_FILE.fullmatch(n)]
    if foreign:
        raise RepoError(
            f"--output {out.path} holds files this command does not write ({', '.join(foreign[:5])}): choose "
            "another folder"
        )
    if names and not out.isfile(STARTED):
        raise RepoError(f"--output {out.path} holds shards but no {STARTED}: choose another folder")
    if not names:
        return
    recorded = read_json(out, STARTED)
    for key, value in asdict(settings).items():
        if recorded.get(key) != value:
            was = recorded.get(key)
            said = f"{len(was)} input files" if key == "inputs" and isinstance(was, list) else f"{key}={was}"
            now = f"{len(value)}" if key == "inputs" else f"{value}"
            raise RepoError(
                f"--output {out.path} was started with {said} (now {now}): rerun with its settings to "
                "continue it, or choose another --output"
            )


def _done(out: DataFolder, rank: int) -> bool:
    return out.isfile(f"{STATE}/logs/completions/{rank:05d}") and out.isfile(
        f"{STATE}/shards/{rank:05d}.json"
    )


def _damaged(out: DataFolder, rank: int) -> str | None:
    """Why a done task's shards are not whole (missing, or a size other than its record's), or None."""
    for shard in read_json(out, f"{STATE}/shards/{rank:05d}.json"):
        if not out.isfile(shard["path"]) or not out.isfile(shard_documents_name(shard["path"])):
            return f"{shard['path']} is missing"
        if (size := out.size(shard["path"])) != 4 * shard["tokens"]:
            return f"{shard['path']} has {size:,} bytes, not {4 * shard['tokens']:,}"
    return None


def _ranks(tasks: int, nodes: int, node_rank: int) -> range:
    """The tasks of machine `node_rank` of `nodes` (contiguous, as datatrove's local_rank_offset takes them)."""
    return range(node_rank * tasks // nodes, (node_rank + 1) * tasks // nodes)


def _check_records(files: list[str], workers: int) -> int:
    """Every record of `files` (`inputs.read_records`), on `workers` processes: the first problem in one line
    (`RepoError`), else the documents they hold."""
    if workers == 1 or len(files) < 2:
        read = map(read_records, files)
    else:
        pool = ProcessPoolExecutor(min(workers, len(files)))
        read = pool.map(read_records, files)
    documents = 0
    try:
        for problem, found in read:
            if problem:
                raise RepoError(problem)
            documents += found
    finally:
        if "pool" in locals():
            pool.shutdown(cancel_futures=True)
    return documents


@dataclass(frozen=True)
class Plan:
    """A checked run of one folder: nothing is written until `execute`."""

    output: str
    root: str
    files: Inputs
    model: Model
    settings: Settings
    ranks: range
    todo: list[int]
    workers: int
    work: str
    progress: bool


def plan(
    model: Model,
    inputs: list[str],
    output: str,
    *,
    shard_tokens: int = SHARD_TOKENS,
    tasks: int | None = None,
    workers: int | None = None,
    nodes: int = 1,
    node_rank: int = 0,
    progress: bool = True,
    flag: str = "input",
) -> Plan:
    """Every check of a run of `output` from `inputs` (named `flag` in errors), before anything is written: a
    problem is a `RepoError` in one line. A done task whose shards are not whole is marked to be redone."""
    files = resolve_inputs(inputs, flag)
    tasks = tasks or len(files.files)
    if not 0 <= node_rank < nodes:  # more machines than tasks: some have none (a mix's small source)
        raise RepoError(f"--node-rank {node_rank} is not one of --nodes {nodes} (0..{nodes - 1})")
    settings = Settings(list(files.files), model.sha256, model.eos_token_id, shard_tokens, tasks)
    out = open_folder(output.rstrip("/"))
    _check_output(out, settings)
    ranks = _ranks(tasks, nodes, node_rank)
    if out.exists(STARTED):
        for rank in ranks:
            if _done(out, rank) and (damage := _damaged(out, rank)):
                print(f"{output}: task {rank}: {damage}; it is redone", file=sys.stderr)
                out.rm_file(f"{STATE}/logs/completions/{rank:05d}")
    todo = [r for r in ranks if not _done(out, r)]
    workers = workers or os.cpu_count() or 1
    documents = _check_records([f for r in todo for f in files.files[r::tasks]], workers)
    if (
        not documents and todo and todo == list(ranks) and nodes == 1
    ):  # a new run (N machines: the join says it)
        raise RepoError(f"{flag} {' '.join(inputs)} holds no document: every record's text is empty")
    root, work = common_root(files.files), _work(out, nodes)
    return Plan(output.rstrip("/"), root, files, model, settings, ranks, todo, workers, work, progress)


def execute(plan: Plan) -> None:
    """Record the plan's settings, input lists and tokenizer in its folder, then run its tasks still to do."""
    out = open_folder(plan.output)
    write_whole(out, STARTED, json.dumps(asdict(plan.settings), indent=1))
    for kind in ("jsonl", "parquet"):
        listed = [f[len(plan.root) + 1 :] for f in getattr(plan.files, kind)]
        write_whole(out, f"{STATE}/{kind}.txt", "".join(f"{p}\n" for p in listed))
    if not out.exists(TOKENIZER):
        write_whole(out, TOKENIZER, plan.model.tokenizer.read_bytes())
    if plan.todo:
        _run(out, plan)


def prepare(
    model: str | PathLike,
    inputs: list[str],
    output: str,
    *,
    eos_token_id: int | None = None,
    nodes: int = 1,
    **options: Any,
) -> Prepared | None:
    """Make (or continue) the data folder `output` from `inputs` with `model`'s tokenizer (`plan`'s options);
    join it when this is the only machine (`nodes == 1`) and return it; on one of several machines run this
    machine's tasks only (`join` then). Every check comes before anything is written."""
    checked = plan(model_tokenizer(model, eos_token_id), inputs, output, nodes=nodes, **options)
    execute(checked)
    return join(output) if nodes == 1 else None


def _run(out: DataFolder, plan: Plan) -> None:
    """datatrove's executor over this machine's tasks, its log under .prepare/ (stderr goes there too, while a
    progress bar of tokens/s shows on the terminal)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader, ParquetReader

    from ..upstream.datatrove import ModelTokenizer

    files, model, settings, ranks, work = plan.files, plan.model, plan.settings, plan.ranks, Path(plan.work)
    readers = [  # task r reads files[r::tasks] of the jsonl files, then the parquet ones (one list)
        Shifted(
            reader(plan.root, paths_file=out.resolve_paths(f"{STATE}/{kind}.txt"), text_key="text"), shift
        )
        for kind, reader, shift in (("jsonl", JsonlReader, 0), ("parquet", ParquetReader, len(files.jsonl)))
        if getattr(files, kind)
    ]
    tokenizer = ModelTokenizer(
        out.resolve_paths(""),
        str(model.tokenizer),
        eos_token_id=model.eos_token_id,
        local_working_dir=str(work),
        save_final_metadata=False,
        max_tokens_per_file=settings.shard_tokens,
        seed=settings.seed,
    )
    executor = LocalPipelineExecutor(
        [TaskStart(out.resolve_paths(""), str(work)), *readers, tokenizer, TaskShards(out.resolve_paths(""))],
        tasks=settings.tasks,
        workers=min(plan.workers, len(ranks)),
        logging_dir=out.resolve_paths(f"{STATE}/logs"),
        local_tasks=len(ranks),
        local_rank_offset=ranks.start,
    )
    work.mkdir(parents=True, exist_ok=True)
    with stderr_to(work / "run.log") as terminal:
        with progress(out, work, ranks, terminal, plan.progress):
            try:
                executor.run()
            except Exception as e:
                said = (str(e).strip().splitlines() or [""])[0]
                raise RepoError(
                    f"a task failed ({type(e).__name__}: {said}); its log is in "
                    f"{out.resolve_paths(f'{STATE}/logs/logs')}; the finished tasks are kept: rerun to continue"
                ) from None


def _work(out: DataFolder, nodes: int) -> str:
    """Where datatrove writes a task's documents before it shuffles them into shards (random reads: a local
    disk): in the output's state when it is a local folder of one machine, else in this machine's temporary
    folder (one per output)."""
    if out.is_local() and nodes == 1:
        return out.resolve_paths(f"{STATE}/work")
    import tempfile

    name = hashlib.sha256(out.resolve_paths("").encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"olmo-repo-prepare-{name}")


def join(output: str) -> Prepared:
    """Check every task's shards and write `data.json` (what the trainers read); `RepoError` naming what is not
    done or not whole (nothing written then)."""
    out = open_folder(output.rstrip("/"))
    if not out.isfile(STARTED):
        raise RepoError(f"--output {output} is not a folder of scripts/prepare_data.py (no {STARTED})")
    settings = read_json(out, STARTED)
    missing = [r for r in range(settings["tasks"]) if not _done(out, r)]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise RepoError(
            f"--output {output}: {len(missing)} of {settings['tasks']} tasks not done ({shown}): run the "
            "machines' parts (--nodes/--node-rank) to the end first"
        )
    shards: list[dict[str, Any]] = []
    for rank in range(settings["tasks"]):
        if damage := _damaged(out, rank):
            raise RepoError(f"--output {output}: {damage}: rerun the command to redo that task")
        shards += read_json(out, f"{STATE}/shards/{rank:05d}.json")
    from tokenizers import Tokenizer

    with out.open(TOKENIZER, "rt") as f:
        vocab_size = Tokenizer.from_str(f.read()).get_vocab_size(with_added_tokens=True)
    tokens, documents = sum(s["tokens"] for s in shards), sum(s["documents"] for s in shards)
    if not tokens:
        raise RepoError(f"--output {output}: its inputs hold no document (every record's text is empty)")
    manifest = {
        "format": DATA_FORMAT,
        "tokenizer": TOKENIZER,
        "eos_token_id": settings["eos_token_id"],
        "vocab_size": vocab_size,
        "dtype": "uint32",
        "tokens": tokens,
        "documents": documents,
        "settings": settings,
        "shards": shards,
    }
    write_whole(out, MANIFEST, json.dumps(manifest, indent=1))
    return Prepared(output, len(shards), tokens, documents, settings["eos_token_id"])
