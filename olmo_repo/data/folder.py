"""What a prepared data folder is, as both trainers read it: `scripts/prepare_data.py`'s output (`olmo_repo.data.
prepare`), one folder per source, and a mix's folder of them (`olmo_repo.data.mix`). Standard library only.

A data folder holds

    data.json                the manifest, written last (a folder without it is unfinished): the shards in order
                             with their tokens and documents, the end id, the dtype, the settings it was made with
    tokenizer.json           the tokenizer the ids were made with (a copy of the model's), what the trainers'
                             data-tokenizer check compares with the checkpoint's
    part-RRRRR-SSSSS.npy     the shards: ids as raw little-endian uint32 (numpy memmap's layout, no header), each
                             document followed by the end id, at most `shard_tokens` (plus one document) each
    part-RRRRR-SSSSS.csv.gz  each shard's documents as `start,end` token offsets, one a line (the Dolma toolkit's
                             metadata, which OLMo-core reads for a remote shard's document boundaries)

and a mix folder holds one such folder per source and `mix.json`: the sources with their shards (paths relative to
the mix folder), OLMo-core's source mixture (each source's `target_ratio` and `max_repetition_ratio`, as
`olmo_core.data.source_mixture.SourceMixtureConfig` takes them) and ai2-olmo's `data.paths` (each source's shards
repeated a whole number of times). `data_paths` and `source_mixture` read them for a config.

A folder is a local path or a URL (s3://, gs://, ...): the functions that read one take the backend's `Fetch`,
which gives a file's local copy (each trainer reads URLs with its own I/O: `olmo_repo.olmocore.checkpoint.
fetch_file`, `olmo_repo.ai2olmo.config.fetch_file`); `local_file` reads local paths only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import RepoError
from ..paths import is_url

__all__ = [
    "DATA_FORMAT",
    "Fetch",
    "MANIFEST",
    "MIX",
    "MIX_FORMAT",
    "SHARD",
    "STORES",
    "STARTED",
    "STATE",
    "TOKENIZER",
    "REMAKE",
    "ai2_olmo_paths",
    "beside_tokenizers",
    "data_folders",
    "data_paths",
    "folder_of",
    "is_data_folder",
    "local_file",
    "manifest",
    "mix",
    "parse",
    "recorded_tokenizer",
    "shard_documents_name",
]

MANIFEST = "data.json"
STATE = ".prepare"
"""A data folder's run state (settings, datatrove's logs): present from the run's start, before data.json."""
SHARD = re.compile(r"part-\d{5}-\d{5}\.npy")
"""A shard's name: `part-TASK-N.npy`."""
STARTED = f"{STATE}/settings.json"
"""The run's settings: the first file a run writes."""
MIX = "mix.json"
TOKENIZER = "tokenizer.json"
DATA_FORMAT = "olmo-repo-data/1"
MIX_FORMAT = "olmo-repo-mix/1"
REMAKE = "make it with the model's tokenizer (scripts/prepare_data.py --model)"
"""What to do about a data folder made with another tokenizer than the model's."""

Fetch = Callable[[str], "Path | None"]
"""A file by its local path or URL, as a local file (a URL's copy downloaded by the backend), or None where there
is none."""


STORES = ("s3://", "gs://", "r2://", "weka://")
"""The object stores a folder may be in besides local disk (where scripts/prepare_data.py writes): an http(s) URL
is never looked up as one (OLMo's data site holds files only)."""


def _may_hold(folder: str) -> bool:
    return not is_url(folder) or folder.startswith(STORES)


def local_file(path: str) -> Path | None:
    """The `Fetch` of local paths: the file, or None where there is none."""
    file = Path(path)
    return file if file.is_file() else None


def shard_documents_name(shard: str) -> str:
    """The document metadata beside a shard (`part-00000-00000.npy` -> `part-00000-00000.csv.gz`), the name
    OLMo-core derives from the shard's (`.npy` replaced by `.csv.gz`)."""
    return shard[: -len(".npy")] + ".csv.gz"


def parse(text: str, where: str, format: str) -> dict[str, Any]:
    """A manifest or mix file's JSON, checked to be of `format`; `RepoError` naming `where` otherwise."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RepoError(f"{where} is not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != format:
        raise RepoError(f"{where} is not a {format} file of scripts/prepare_data.py")
    return data


def manifest(folder: str | Path, fetch: Fetch = local_file) -> dict[str, Any]:
    """A data folder's `data.json`; `RepoError` saying what to do when it is missing (an unfinished or wrong
    folder) or lists no token."""
    path = f"{str(folder).rstrip('/')}/{MANIFEST}"
    if (file := fetch(path)) is None:
        raise RepoError(
            f"{folder} has no {MANIFEST}: not a finished data folder of scripts/prepare_data.py (rerun it, or "
            "its --join step after a run on several machines)"
        )
    data = parse(file.read_text(encoding="utf-8"), path, DATA_FORMAT)
    if not data.get("tokens"):  # written before prepare_data.py refused such inputs
        raise RepoError(
            f"{folder} holds no tokens: its inputs had no document (every text empty); make it again from records "
            "with text (scripts/prepare_data.py)"
        )
    return data


def mix(folder: str | Path, fetch: Fetch = local_file) -> dict[str, Any] | None:
    """A mix folder's `mix.json`, or None where `folder` has none (not a mix folder)."""
    path = f"{str(folder).rstrip('/')}/{MIX}"
    if not _may_hold(path) or (file := fetch(path)) is None:
        return None
    return parse(file.read_text(encoding="utf-8"), path, MIX_FORMAT)


def data_paths(root: str, data: dict[str, Any]) -> list[str]:
    """The shards a manifest lists, as paths under `root` (the folder's local path or URL)."""
    return [f"{root.rstrip('/')}/{shard['path']}" for shard in data["shards"]]


def ai2_olmo_paths(root: str, data: dict[str, Any]) -> list[str]:
    """ai2-olmo's `data.paths` of a mix: each source's shards as many times as its repetition."""
    return [f"{root.rstrip('/')}/{path}" for path in data["ai2_olmo"]["paths"]]


def is_data_folder(folder: str | Path, fetch: Fetch = local_file) -> bool:
    """Whether a folder is a data folder of scripts/prepare_data.py: finished, or (local) started and not
    finished (`manifest` then says which)."""
    folder = str(folder).rstrip("/")
    return _may_hold(folder) and (
        fetch(f"{folder}/{MANIFEST}") is not None
        or (Path(folder) / STATE).is_dir()
        or fetch(f"{folder}/{STARTED}") is not None  # a URL has no folders: the file a run writes first
    )


def folder_of(path: str) -> str:
    """The folder of a file's local path or URL: what would be its data folder."""
    return path.rstrip("/").rpartition("/")[0] or "."


def data_folders(paths: Iterable[str], fetch: Fetch = local_file) -> list[str]:
    """The data folders of scripts/prepare_data.py that shards in `paths` belong to, once each, in order (each
    folder looked up once, however many of its shards are listed). A URL's folder is looked up only for a file
    named as a shard (`SHARD`): the thousands of remote files of OLMo's own mixes cost no request."""
    folders = dict.fromkeys(
        folder_of(str(p)) for p in paths if not is_url(p) or SHARD.fullmatch(str(p).rpartition("/")[2])
    )
    return [folder for folder in folders if is_data_folder(folder, fetch)]


def recorded_tokenizer(folder: str, data: dict[str, Any], fetch: Fetch) -> Path:
    """The local copy of the tokenizer a data folder was made with (`data`: its data.json, which names it);
    `RepoError` where it is missing."""
    path = f"{folder}/{data['tokenizer']}"
    if (file := fetch(path)) is None:
        raise RepoError(
            f"{path} is missing: the tokenizer {folder} was made with (its data.json names it): {REMAKE}"
        )
    return file


def beside_tokenizers(paths: Iterable[str], folders: Iterable[str]) -> Iterator[tuple[str, str, Path]]:
    """scripts/tokenize_text.py's files among `paths` (not in one of the data `folders`), each with its folder and
    the tokenizer.json it wrote beside it (local files only): (path, folder, tokenizer file)."""
    folders = set(folders)
    for path in paths:
        folder = folder_of(path)
        if folder not in folders and (made := local_file(f"{folder}/{TOKENIZER}")):
            yield path, folder, made
