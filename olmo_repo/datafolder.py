"""What a prepared data folder is, as both trainers read it: `scripts/prepare_data.py`'s output (`olmo_repo.fetch.
prepare`), one folder per source, and a mix's folder of them (`olmo_repo.fetch.mix`). Standard library only.

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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import RepoError

__all__ = [
    "DATA_FORMAT",
    "MANIFEST",
    "MIX",
    "MIX_FORMAT",
    "STATE",
    "TOKENIZER",
    "ai2_olmo_paths",
    "data_paths",
    "folder_of",
    "is_data_folder",
    "manifest",
    "mix",
    "parse",
    "shard_documents_name",
]

MANIFEST = "data.json"
STATE = ".prepare"
"""A data folder's run state (settings, datatrove's logs): present from the run's start, before data.json."""
MIX = "mix.json"
TOKENIZER = "tokenizer.json"
DATA_FORMAT = "olmo-repo-data/1"
MIX_FORMAT = "olmo-repo-mix/1"


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


def manifest(folder: str | Path) -> dict[str, Any]:
    """A local data folder's `data.json`; `RepoError` saying what to do when it is missing (an unfinished or
    wrong folder)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise RepoError(
            f"{folder} has no {MANIFEST}: not a finished data folder of scripts/prepare_data.py (rerun it, or "
            "its --join step after a run on several machines)"
        )
    return parse(path.read_text(encoding="utf-8"), str(path), DATA_FORMAT)


def mix(folder: str | Path) -> dict[str, Any]:
    """A local mix folder's `mix.json`."""
    path = Path(folder) / MIX
    if not path.is_file():
        raise RepoError(f"{folder} has no {MIX}: not a mix folder of scripts/prepare_data.py --mix")
    return parse(path.read_text(encoding="utf-8"), str(path), MIX_FORMAT)


def data_paths(root: str, data: dict[str, Any]) -> list[str]:
    """The shards a manifest lists, as paths under `root` (the folder's local path or URL)."""
    return [f"{root.rstrip('/')}/{shard['path']}" for shard in data["shards"]]


def ai2_olmo_paths(root: str, data: dict[str, Any]) -> list[str]:
    """ai2-olmo's `data.paths` of a mix: each source's shards as many times as its repetition."""
    return [f"{root.rstrip('/')}/{path}" for path in data["ai2_olmo"]["paths"]]


def is_data_folder(folder: str | Path) -> bool:
    """Whether a local folder is a data folder of scripts/prepare_data.py, finished or not (`manifest` then
    says which)."""
    return (Path(folder) / MANIFEST).is_file() or (Path(folder) / STATE).is_dir()


def folder_of(path: str | Path) -> Path | None:
    """The local data folder a shard belongs to (its parent, where that is one), else None."""
    parent = Path(path).parent
    return parent if is_data_folder(parent) else None
