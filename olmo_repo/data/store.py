"""A data folder's files through datatrove's `DataFolder` (a local folder or an s3:// URL), what
`olmo_repo.data.prepare`, its pipeline's steps and mixes read and write there."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..output import write_file

if TYPE_CHECKING:
    from datatrove.io import DataFolder

__all__ = ["open_folder", "read_json", "write_whole"]


def open_folder(url: str) -> DataFolder:
    """datatrove's `DataFolder` of a local path or URL."""
    from datatrove.io import get_datafolder

    return get_datafolder(url)


def read_json(folder: DataFolder, name: str) -> Any:
    """The JSON file `name` of `folder` (a record of the state, the settings, a manifest)."""
    with folder.open(name, "rt") as f:
        return json.load(f)


def write_whole(folder: DataFolder, name: str, data: bytes | str) -> None:
    """A file of the state or the manifest, whole or not at all: renamed into place locally, one PUT remotely."""
    if folder.is_local():
        write_file(folder.resolve_paths(name), data)
    else:
        folder.pipe_file(name, data.encode() if isinstance(data, str) else data)
