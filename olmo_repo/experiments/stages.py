"""The one stage runner of the experiments: resumable stages in a folder, their records, and what a rerun does.

An experiment (the demo, the SmolLM2 recipe, the position study) is a `Stages` subclass: it knows every stage's
inputs before any runs (a digest of everything the stage reads, the stages before it included), calls `run` for
each stage in order, and rewrites its report from the records in `publish`, which the runner calls after every
stage that ran. A rerun skips a stage that finished with the same inputs (and says so), resumes or redoes one
that was interrupted, and redoes one whose inputs changed or whose records cannot be read (in one line). The
folder is a new or empty one, or a previous run's of the same kind: every entry an experiment writes is named
through `entry()` and listed in a marker file, so a rerun replaces exactly what the experiment wrote and nothing a
user put there.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import RepoError
from ..output import write_file

__all__ = ["UNREADABLE", "Stages", "digest", "read_json"]

UNREADABLE = (OSError, ValueError, KeyError, TypeError, RepoError)
"""What reading a damaged record raises: its stage is redone."""

_T = TypeVar("_T")


class Stages:
    """An experiment's output folder and its stages. A non-empty folder without the marker (a user's, or another
    kind of experiment's) is refused (`RepoError`) before any work."""

    MARKER = ".olmo-repo-demo"  # the name every experiment's folder has carried since the demo's first
    STAGES = "stages.json"  # {stage: {"inputs": digest, "done": bool, and the facts its work returned}}

    def __init__(self, path: Path, kind: str = "demo", writes: str = "its corpus and runs"):
        """`kind` and `writes` name the command and what it writes in the message that refuses a folder."""
        self.path, marker = path, path / self.MARKER
        self.inputs: dict[str, str] = {}  # {stage: digest of its inputs}: the subclass fills it before `run`
        self.ran: set[str] = set()  # the stages this start ran
        if path.exists() and not path.is_dir():
            raise RepoError(f"{path} is a file: pass a folder for the {kind}'s outputs")
        if marker.is_file():
            self.entries: list[str] = read_json(marker, f"the {kind}'s list of its files: pass a new folder")
        elif path.is_dir() and any(path.iterdir()):
            raise RepoError(
                f"{path} is not empty and not a previous {kind}'s folder: pass a new or empty folder (the {kind} "
                f"writes {writes} there)"
            )
        else:
            self.entries = []

    # -- running a stage ------------------------------------------------------------------------------------

    def run(
        self,
        name: str,
        outputs: list[str],
        work: Callable[[bool], dict[str, Any] | None],
        read: Callable[[], _T] = lambda: None,  # type: ignore[assignment, return-value]
        resumes: bool = False,
    ) -> _T:
        """Stage `name` with inputs `self.inputs[name]`; returns `read()`, its results read back from its records.

        Skipped (said in one line) when it finished before with the same inputs and `read()` can read them;
        redone (said in one line) when it cannot. Otherwise its `outputs` (entries) are removed unless a start
        with the same inputs was interrupted, `work(resume)` runs it (resume: that start left a partial result,
        which a stage that `resumes` continues) and returns the facts to record with it, and `publish()` follows."""
        inputs = self.inputs[name]
        state = self.state(name, inputs, outputs)
        if state == "done":
            try:
                result = read()
            except UNREADABLE as e:
                print(f"== {name}: its recorded results cannot be read ({e}); redoing it", flush=True)
                self.redo(name, inputs, outputs)
                state = "new"
            else:
                print(f"== {name}: finished before with the same inputs, skipped", flush=True)
                return result
        elif state == "resume":
            print(f"== {name}: started before and interrupted, {'resuming' if resumes else 'redoing'} it")
        self.finish(name, **(work(state == "resume") or {}))
        self.ran.add(name)
        self.publish()
        return read()

    def recorded(self, name: str, read: Callable[[], _T], partial: bool = False) -> _T | None:
        """`read()` of stage `name` if it finished with its current inputs (`partial`: or started with them)
        and its records can be read, else None."""
        record = self.record(name)
        if record is None or record["inputs"] != self.inputs.get(name) or not (record["done"] or partial):
            return None
        try:
            return read()
        except UNREADABLE:
            return None

    def done(self, name: str) -> bool:
        """Whether stage `name` finished with its current inputs."""
        return self.recorded(name, lambda: True) or False

    def publish(self) -> None:
        """Rewrite the experiment's report from its records (the subclass's; here nothing)."""

    # -- the records ----------------------------------------------------------------------------------------

    def state(self, name: str, inputs: str, outputs: list[str]) -> str:
        """Where stage `name` stands for these `inputs`: "done" (finished with them: skip it), "resume" (started
        with them: its outputs hold a partial result) or "new" (never started, or with other inputs: its
        `outputs`, entries of a previous run, are removed)."""
        record = self.record(name)
        if record is not None and record["inputs"] == inputs:
            return "done" if record["done"] else "resume"
        self.redo(name, inputs, outputs)
        return "new"

    def redo(self, name: str, inputs: str, outputs: list[str]) -> None:
        """Start stage `name` afresh with `inputs`: its `outputs` (entries of a previous run) are removed."""
        self.remove(*outputs)
        self._record(name, {"inputs": inputs, "done": False})

    def finish(self, name: str, **facts: Any) -> None:
        """Mark stage `name` finished (with `facts` to recall on a rerun that skips it, e.g. its wall time)."""
        self._record(name, {**self._stages()[name], **facts, "done": True})

    def record(self, name: str) -> dict | None:
        """What stage `name` recorded: its inputs, whether it finished, the facts `finish` was given."""
        return self._stages().get(name)

    def _stages(self) -> dict[str, dict]:
        path = self.path / self.STAGES
        if not path.is_file():
            return {}
        return read_json(path, "what each stage recorded: remove it to redo every stage")

    def _record(self, name: str, record: dict) -> None:
        self.write_text(self.STAGES, json.dumps({**self._stages(), name: record}, indent=1))

    # -- the entries ----------------------------------------------------------------------------------------

    def entry(self, name: str) -> Path:
        """`path / name`, recorded as the experiment's before anything is written to it."""
        if name not in self.entries:
            self.entries.append(name)
            self._save()
        return self.path / name

    def write_text(self, name: str, text: str) -> bool:
        """Write the entry `name` whole (`olmo_repo.output.write_file`), unless it already holds `text`; returns
        whether it was written."""
        path = self.entry(name)
        if path.is_file() and path.read_bytes() == text.encode():
            return False
        write_file(path, text)
        return True

    def clear(self) -> None:
        """Remove what a previous run wrote here; everything else in the folder stays."""
        self.remove(*self.entries)
        self.entries = []
        self._save()

    def remove(self, *names: str) -> None:
        """Remove entries of a previous run (names that are not its entries are left alone)."""
        for name in names:
            target = self.path / name
            if name not in self.entries:
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)

    def _save(self) -> None:  # whole or not at all: a kill at any moment leaves a readable marker
        write_file(self.path / self.MARKER, json.dumps(self.entries))


def read_json(path: Path, what: str) -> Any:
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
