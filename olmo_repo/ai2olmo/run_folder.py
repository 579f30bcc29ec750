"""The run folder (`save_folder`) across starts: which checkpoint resumes, whether the config still fits it,
whether a folder without a checkpoint is a new run, and `metrics.jsonl` and the data indices after a resume."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import re
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist
from olmo.aliases import PathOrStr
from olmo.config import (
    TrainConfig,
)
from olmo.exceptions import OLMoCheckpointError, OLMoConfigurationError, OLMoError
from olmo.torch_util import (
    get_global_rank,
)
from olmo.util import (
    find_latest_checkpoint,
    resource_path,
)
from omegaconf import OmegaConf as om

from ..errors import CorruptFileError
from ..integrity import checkpoint_problems, latest_intact
from ..modes import FPhiTraining, repo_layer_ids
from ..output import write_file
from .config import f_phi_has_own_group

log = logging.getLogger(__name__)


T = TypeVar("T")


def decided_on_rank0(decide: Callable[[], T]) -> T:
    """`decide()` on rank 0 (it reads the run folder), and its result, or the OLMoError it raised, on every
    rank, so that all ranks go on or stop together (without a process group: `decide()`, as the launcher checks)."""
    if not dist.is_initialized():
        return decide()
    outcome: list[Any] = [None]
    if get_global_rank() == 0:
        try:
            outcome[0] = (decide(), None)
        except OLMoError as e:
            outcome[0] = (None, e)
    dist.broadcast_object_list(outcome, src=0)
    result, error = outcome[0]
    if error is not None:
        raise error
    return result


def latest_checkpoint(cfg: TrainConfig) -> str | None:
    """The latest intact checkpoint in save_folder (a corrupt newer one is moved aside with a warning, see
    `latest_intact_checkpoint`), else the latest in remote_save_folder. Includes the pre-train checkpoint
    `step0-unsharded`, which OLMo's `find_latest_checkpoint` skips, so a run killed before its first save
    also restarts with the same command."""

    def find() -> str | None:
        if (
            Path(cfg.save_folder).is_dir()
            and (local := latest_intact_checkpoint(cfg.save_folder)) is not None
        ):
            return str(local)
        if cfg.remote_save_folder is not None and (remote := find_latest_checkpoint(cfg.remote_save_folder)):
            return str(remote)
        return None

    return decided_on_rank0(find)


# Keys that resuming itself sets, and model keys that change neither the parameters nor what they compute.
_RESUME_KEYS = {"load_path", "restore_dataloader", "reset_optimizer_state", "reset_trainer_state"}
_MODEL_RUNTIME_KEYS = {"model.init_device", "model.flash_attention", "model.precision"}


def _flat(config: TrainConfig) -> dict[str, Any]:
    """{dotted key: value} of a config as its config.yaml holds it."""
    with tempfile.TemporaryDirectory() as tmp:
        config.save(Path(tmp) / "config.yaml")
        tree = om.to_container(om.load(Path(tmp) / "config.yaml"), resolve=True)

    def walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, f"{prefix}{key}.")
        else:
            yield prefix.rstrip("."), node

    return dict(walk(tree, ""))


def check_resumed_config(cfg: TrainConfig, checkpoint: str) -> None:
    """Compare this run's config with the one `checkpoint` was saved with: a different model is refused with
    the keys that differ (it would load as a stage-1 init, or fail), and so is a changed `f_phi` section (its
    param groups and the optimizer state in them are of the saved values), in one line naming both values;
    other changed keys are logged."""

    def changes() -> dict[str, tuple[Any, Any]]:
        saved = _flat(type(cfg).load(resource_path(checkpoint, "config.yaml"), validate_paths=False))
        now = _flat(cfg)
        keys = sorted((saved.keys() | now.keys()) - _RESUME_KEYS)
        return {k: (saved.get(k), now.get(k)) for k in keys if saved.get(k) != now.get(k)}

    def shown(items: dict[str, tuple[Any, Any]]) -> str:
        return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in items.items())

    changed = decided_on_rank0(changes)
    saved = {k.removeprefix("f_phi."): old for k, (old, _) in changed.items() if k.startswith("f_phi.")}
    if problem := cfg.f_phi.resume_problem(dataclasses.replace(cfg.f_phi, **saved), checkpoint):
        # the optimizer state is of the saved values
        raise OLMoConfigurationError(
            f"{problem} (--load_path={checkpoint} --reset_optimizer_state=true starts from that checkpoint)"
        )
    model = {k: v for k, v in changed.items() if k.startswith("model.") and k not in _MODEL_RUNTIME_KEYS}
    if model:
        raise OLMoConfigurationError(
            f"save_folder={cfg.save_folder} holds checkpoints of a different model ({checkpoint}): "
            f"{shown(model)}. Train this config in a new --save_folder (add --load_path={checkpoint} to start "
            "from that checkpoint)"
        )
    if changed:
        log.warning("Resuming %s with settings changed since: %s", checkpoint, shown(changed))


def check_optimizer_groups(cfg: TrainConfig) -> None:
    """A `load_path` whose optimizer state is loaded (not `reset_optimizer_state`) must have this run's param
    groups: f_phi's own (`f_phi_has_own_group`) or not, f_phi alone
    (`f_phi.only`) or not; else one line saying so (OLMo's loader would fail on an assertion). A stage-1
    checkpoint (no RePo layers) passes: its state is continued by parameter name (`olmo_repo.ai2olmo.stage1`)."""
    if cfg.load_path is None or cfg.reset_optimizer_state or getattr(cfg, "f_phi", None) is None:
        return
    try:
        saved = type(cfg).load(resource_path(cfg.load_path, "config.yaml"), validate_paths=False)
    except FileNotFoundError:  # weights from elsewhere: no optimizer state of this project's
        return
    if not repo_layer_ids(saved.model):
        return

    def layout(f_phi: FPhiTraining) -> str:
        own = f_phi_has_own_group(f_phi)
        return f"{'a' if own else 'no'} param group of f_phi's own" + (
            ", the rest frozen" if f_phi.only else ""
        )

    if layout(saved.f_phi) != layout(cfg.f_phi):
        raise OLMoConfigurationError(
            f"load_path={cfg.load_path} holds an optimizer state with {layout(saved.f_phi)} (f_phi: "
            f"{_shown(saved.f_phi)}), this run's has {layout(cfg.f_phi)} (f_phi: {_shown(cfg.f_phi)}): pass "
            "--reset_optimizer_state=true to start the optimizer fresh"
        )


def _shown(f_phi: FPhiTraining) -> str:
    return ", ".join(f"{f.name}={_yaml(getattr(f_phi, f.name))}" for f in dataclasses.fields(f_phi))


def _yaml(value: Any) -> str:
    """A config value as a `--key=value` override writes it (null, true, 10.0)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def earlier_start_here(cfg: TrainConfig) -> bool:
    """Whether save_folder/config.yaml is from an earlier start of a run in this folder (its save_folder is
    this one) that failed or was killed before its first checkpoint. One that some other program wrote there
    is refused unless --save_overwrite."""
    saved = Path(cfg.save_folder) / "config.yaml"
    if not saved.is_file():
        return False
    try:
        folder = om.load(saved).get("save_folder")
    except Exception:  # not a YAML mapping: not ours
        folder = None
    if folder is not None and Path(str(folder)).resolve() == Path(cfg.save_folder).resolve():
        return True
    if cfg.save_overwrite:
        return False
    raise OLMoConfigurationError(
        f"{saved} exists and was not written by a run in this folder: use a new save_folder, or --save_overwrite"
    )


def _gzip_text(data: bytes) -> tuple[str, bool]:
    """The text of a gzip file's members, as far as they can be read, and whether all of it could be: a process
    killed while appending leaves its member without an end (what it flushed still decompresses)."""
    text = []
    while data:
        member = zlib.decompressobj(wbits=31)  # one gzip member
        try:
            text.append(member.decompress(data))
        except zlib.error:
            return b"".join(text).decode(errors="replace"), False
        if not member.eof:
            return b"".join(text).decode(errors="replace"), False
        data = member.unused_data
    return b"".join(text).decode(errors="replace"), True


def trim_data_indices(path: Path, step: int) -> None:
    """Drop the records after `step` (and a line or gzip member cut short by a kill) from a data-indices file
    (`STEP\tINDEX...` lines, gzip): the resumed run records those steps again, appending a member of its own,
    which a member left without its end would make unreadable."""
    if not path.is_file():
        return
    text, intact = _gzip_text(path.read_bytes())
    lines = text.splitlines(keepends=True)

    def keep(line: str) -> bool:
        head = line.split("\t", 1)[0]
        return line.endswith("\n") and head.isdigit() and int(head) <= step

    kept = [line for line in lines if keep(line)]
    if intact and len(kept) == len(lines):
        return
    write_file(path, gzip.compress("".join(kept).encode(), mtime=0))
    log.info("%s: %d records after step %d dropped (recorded again now)", path, len(lines) - len(kept), step)


_STEP_DIR = re.compile(r"step(\d+)(-unsharded)?")


def latest_intact_checkpoint(folder: PathOrStr) -> Path | None:
    """The latest checkpoint in a local run folder (`stepN` sharded before `stepN-unsharded`, step 0 included)
    whose files are intact (`olmo_repo.integrity.latest_intact`: a newer corrupt one is moved aside to
    `stepN...corrupt` with a warning; if every checkpoint is corrupt, that is an error)."""
    candidates = sorted(
        (int(m[1]), m[2] is None, p)
        for p in Path(folder).glob("step*")
        if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()
    )

    def problems(path: Path) -> list[str]:
        sharded = not path.name.endswith("-unsharded")
        required = ("config.yaml",) if sharded else ("config.yaml", "model.pt", "optim.pt", "train.pt")
        return [f"{path / f}: missing" for f in required if not (path / f).is_file()] + checkpoint_problems(
            path
        )

    try:
        return latest_intact(folder, [p for *_, p in reversed(candidates)], problems)
    except CorruptFileError as e:
        raise OLMoCheckpointError(str(e)) from None
