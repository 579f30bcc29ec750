"""The demo's output folder: a rerun replaces exactly what a previous demo wrote, and nothing a user put there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import RepoError

__all__ = ["DemoFolder"]


class DemoFolder:
    """The demo's output folder: a new or empty one, or a previous demo's. Every entry the demo writes is named
    through `entry()` and listed in a marker file, so that a rerun removes exactly the previous demo's outputs
    and nothing a user put there. A non-empty folder without the marker is refused (`RepoError`) before any
    work."""

    MARKER = ".olmo-repo-demo"

    def __init__(self, path: Path):
        self.path, marker = path, path / self.MARKER
        if path.exists() and not path.is_dir():
            raise RepoError(f"{path} is a file: pass a folder for the demo's outputs")
        if marker.is_file():
            self.entries: list[str] = json.loads(marker.read_text())
        elif path.is_dir() and any(path.iterdir()):
            raise RepoError(
                f"{path} is not empty and not a previous demo's folder: pass a new or empty folder (the demo "
                "writes its corpus and runs there)"
            )
        else:
            self.entries = []

    def clear(self) -> None:
        """Remove what a previous demo wrote here; everything else in the folder stays."""
        for name in self.entries:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        self.entries = []
        self._save()

    def entry(self, name: str) -> Path:
        """`path / name`, recorded as the demo's before anything is written to it."""
        if name not in self.entries:
            self.entries.append(name)
            self._save()
        return self.path / name

    def _save(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / self.MARKER).write_text(json.dumps(self.entries))
