"""The demo's output folder: a rerun resumes or replaces exactly what a previous demo wrote, and nothing a user
put there."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from ..errors import RepoError
from ..output import write_file

__all__ = ["DemoFolder"]


class DemoFolder:
    """The demo's output folder: a new or empty one, or a previous demo's. Every entry the demo writes is named
    through `entry()` and listed in a marker file, so that a rerun removes exactly the previous demo's outputs
    and nothing a user put there. A non-empty folder without the marker is refused (`RepoError`) before any
    work."""

    MARKER = ".olmo-repo-demo"
    STAGES = "stages.json"  # {stage: {"inputs": digest, "done": bool, and the facts `finish` was given}}

    def __init__(self, path: Path, kind: str = "demo", writes: str = "its corpus and runs"):
        """`kind` and `writes` name the command and what it writes in the message that refuses a folder."""
        self.path, marker = path, path / self.MARKER
        if path.exists() and not path.is_dir():
            raise RepoError(f"{path} is a file: pass a folder for the {kind}'s outputs")
        if marker.is_file():
            self.entries: list[str] = _read_json(marker, f"the {kind}'s list of its files: pass a new folder")
        elif path.is_dir() and any(path.iterdir()):
            raise RepoError(
                f"{path} is not empty and not a previous {kind}'s folder: pass a new or empty folder (the {kind} "
                f"writes {writes} there)"
            )
        else:
            self.entries = []

    def clear(self) -> None:
        """Remove what a previous demo wrote here; everything else in the folder stays."""
        self.remove(*self.entries)
        self.entries = []
        self._save()

    def remove(self, *names: str) -> None:
        """Remove entries of a previous demo (their names must be the demo's: `entry()`)."""
        for name in names:
            target = self.path / name
            if name not in self.entries:
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)

    def stage(self, name: str, inputs: str, outputs: list[str]) -> str:
        """Where stage `name` stands for these `inputs` (a digest of everything it reads): "done" (finished
        with them: skip it), "resume" (started with them: its outputs hold a partial result to continue), or
        "new" (never started, or with other inputs: its `outputs`, entries of a previous demo, are removed)."""
        record = self.record(name)
        if record is not None and record["inputs"] == inputs:
            return "done" if record["done"] else "resume"
        self.redo(name, inputs, outputs)
        return "new"

    def redo(self, name: str, inputs: str, outputs: list[str]) -> None:
        """Start stage `name` afresh with `inputs`: its `outputs` (entries of a previous demo) are removed."""
        self.remove(*outputs)
        self._record(name, {"inputs": inputs, "done": False})

    def finish(self, name: str, **facts: float | str) -> None:
        """Mark stage `name` finished (with `facts` to recall on a rerun that skips it, e.g. its wall time)."""
        self._record(name, {**self._stages()[name], **facts, "done": True})

    def record(self, name: str) -> dict | None:
        """What stage `name` recorded: its inputs, whether it finished, the facts `finish` was given."""
        return self._stages().get(name)

    def write_text(self, name: str, text: str) -> bool:
        """Write the entry `name` whole (`olmo_repo.output.write_file`), unless it already holds `text`; returns
        whether it was written."""
        path = self.entry(name)
        if path.is_file() and path.read_bytes() == text.encode():
            return False
        write_file(path, text)
        return True

    def _stages(self) -> dict[str, dict]:
        path = self.path / self.STAGES
        if not path.is_file():
            return {}
        return _read_json(path, "what each stage recorded: remove it to redo every stage")

    def _record(self, name: str, record: dict) -> None:
        self.write_text(self.STAGES, json.dumps({**self._stages(), name: record}, indent=1))

    def entry(self, name: str) -> Path:
        """`path / name`, recorded as the demo's before anything is written to it."""
        if name not in self.entries:
            self.entries.append(name)
            self._save()
        return self.path / name

    def _save(self) -> None:  # whole or not at all: a kill at any moment leaves a readable marker
        write_file(self.path / self.MARKER, json.dumps(self.entries))


def _read_json(path: Path, what: str) -> Any:
    """The JSON file `path`, or `RepoError` in one line saying it cannot be read, `what` it holds and what to do."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RepoError(f"{path} cannot be read ({e}); it holds {what}") from e


def digest(*parts: str | bytes) -> str:
    """A short digest of `parts` (each length-prefixed): what a stage records of its inputs."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]
