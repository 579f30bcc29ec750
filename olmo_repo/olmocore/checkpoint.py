"""OLMo-core checkpoints: what OLMo-core's Trainer writes, and model-only ones for conversion and stage-1 init.

A step directory of a run (`save_folder/stepN/`) holds `model_and_optim/` (torch.distributed.checkpoint shards
with `.metadata`), `train/rank{i}.pt` (the trainer's state: its step, `steps_done`) and `config.json` (the run's `ExperimentConfig` as OLMo-core's
`ConfigSaverCallback` writes it; its `model` builds the model, `_CLASS_` names `RepoAttentionConfig`). A
model-only checkpoint (written by `save_model`, e.g. from an HF model) has `model_and_optim/` with the model
alone and a `config.json` with `model` and `dataset.tokenizer`: OLMo-core's `Trainer.load_checkpoint` and this
project's stage-1 initialisation read it like a run's step.

Reading needs no process group: torch.distributed.checkpoint loads in one process, whatever the world size the
checkpoint was written with.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from olmo_core.distributed.checkpoint import (
    get_checkpoint_metadata,
    load_model_and_optim_state,
    save_model_and_optim_state,
)
from olmo_core.io import file_exists, resource_path
from olmo_core.nn.transformer import Transformer, TransformerConfig
from torch.distributed.checkpoint.metadata import Metadata

from ..data import folder as datafolder
from ..errors import CorruptFileError, RepoError, command
from ..integrity import file_problem, latest_intact
from ..paths import is_url
from ..upstream.olmo_core import truncated_files
from . import attention  # noqa: F401  (registers RepoAttentionConfig before any config is decoded)

__all__ = [
    "CONFIG",
    "MODEL_AND_OPTIM",
    "is_checkpoint",
    "latest_intact_checkpoint",
    "load_model",
    "read_config",
    "read_metadata",
    "save_model",
    "steps_done",
]

CONFIG = "config.json"
MODEL_AND_OPTIM = "model_and_optim"


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is an OLMo-core checkpoint (a step directory or a model-only one)."""
    return (Path(path) / MODEL_AND_OPTIM / ".metadata").is_file()


def not_a_checkpoint(path: str | Path, key: str = "") -> str:
    """The one-line error for `path` (given as `key`, e.g. "load_path=") where an OLMo-core checkpoint is
    needed, saying what it is instead and what to pass."""
    if is_url(path):  # nothing to look at
        return f"{key}{path}: not an OLMo-core checkpoint, no {MODEL_AND_OPTIM}/.metadata"
    path = Path(path)
    steps = sorted(
        (p for p in path.glob("step*") if re.fullmatch(r"step\d+", p.name) and is_checkpoint(p)),
        key=lambda p: int(p.name[4:]),
    )
    if not path.exists():
        hint = ": it does not exist"
    elif steps:
        hint = f" but a run's folder: pass one of its checkpoints, e.g. the latest, {steps[-1]}"
    elif (path / "model.pt").is_file() or (path / "config.yaml").is_file():
        hint = (
            f" (it is an ai2-olmo checkpoint: {command('convert_to_hf')} where ai2-olmo is installed makes it an HF "
            f"directory, which {command('core_convert_from_hf')} makes an OLMo-core checkpoint)"
        )
    elif (path / "config.json").is_file():
        hint = f" (it is a Hugging Face directory: {command('core_convert_from_hf')} converts it)"
    else:
        hint = f", no {MODEL_AND_OPTIM}/.metadata"
    return f"{key}{path}: not an OLMo-core checkpoint{hint}"


def read_metadata(directory: str | Path, key: str = "") -> Metadata:
    """The torch.distributed.checkpoint metadata of `directory` (a `model_and_optim/`, local or a URL; given as
    `key`, e.g. "load_path="), once a local one is whole: `CorruptFileError` naming a `.metadata` that cannot
    be read or a file shorter than it says (a save that did not end), before anything loads; FileNotFoundError
    where there is no `.metadata`."""
    metadata, damage = _read_whole(directory)
    if damage is not None:
        raise CorruptFileError(
            f"{key}{damage}: the checkpoint was not written to its end; write it again or use another one"
        )
    return metadata


def _read_whole(directory: str | Path) -> tuple[Any, str | None]:
    """(metadata or None, "FILE is ..." for the first damaged file of `directory` or None)."""
    try:
        metadata = get_checkpoint_metadata(directory)
    except (EOFError, pickle.UnpicklingError, AttributeError, ValueError) as e:
        return None, f"{directory}/.metadata cannot be read ({e})"
    if not is_url(directory):
        for file, size, need in truncated_files(Path(directory), metadata):
            return metadata, f"{file} is {'missing' if size < 0 else f'{size:,} bytes of {need:,}'}"
    return metadata, None


def checkpoint_problems(step: Path) -> list[str]:
    """`FILE: problem` for each file of a run's local checkpoint `step` that a resume would fail on."""
    problems = [f"{step / 'train'}: missing"] if not (step / "train").is_dir() else []
    problems += [f"{f}: {why}" for f in sorted(step.glob("train/*.pt")) if (why := file_problem(f))]
    try:
        _, damage = _read_whole(step / MODEL_AND_OPTIM)
    except FileNotFoundError:
        damage = f"{step / MODEL_AND_OPTIM / '.metadata'}: missing"
    return problems + ([damage] if damage else [])


def latest_intact_checkpoint(folder: str | Path, move_aside: bool = True) -> Path | None:
    """The latest checkpoint (`stepN/`) of a local run folder that a resume can load, by the rule of both
    trainers (`olmo_repo.integrity.latest_intact`): a newer corrupt one is moved aside to `stepN.corrupt`
    (with `move_aside`: rank 0), so that OLMo-core's own resume, which takes the newest, loads this one."""
    steps = sorted(
        (p for p in Path(folder).glob("step*") if re.fullmatch(r"step\d+", p.name) and p.is_dir()),
        key=lambda p: int(p.name[4:]),
        reverse=True,
    )
    return latest_intact(folder, steps, checkpoint_problems, move_aside)


def fetch_file(path: str) -> Path | None:
    """`datafolder.Fetch` through OLMo-core's I/O: a local file, or a URL's copy in its download cache."""
    if not is_url(path):
        return datafolder.local_file(path)
    if not file_exists(path):
        return None
    folder, _, name = path.rpartition("/")
    return Path(resource_path(folder, name))


def read_config(path: str | Path) -> dict[str, Any]:
    """The `config.json` of an OLMo-core checkpoint; `RepoError` naming the file when it is missing or not an
    OLMo-core checkpoint of this project."""
    path = Path(path)
    if not is_checkpoint(path):
        raise RepoError(not_a_checkpoint(path))
    file = path / CONFIG
    if not file.is_file():
        raise RepoError(
            f"{file} is missing: the checkpoint's model config is read from it (ConfigSaverCallback)"
        )
    return parse_config(file.read_bytes(), str(file))


def parse_config(data: bytes, where: str) -> dict[str, Any]:
    """A checkpoint's `config.json` from its bytes (`where`: the file or URL they came from, for the one line
    that says what is wrong with them)."""
    try:
        config = json.loads(data)
    except json.JSONDecodeError as e:
        raise RepoError(f"{where} is not valid JSON ({e.msg}, line {e.lineno})") from None
    except UnicodeDecodeError as e:
        raise RepoError(f"{where} is not valid JSON ({e})") from None
    if not isinstance(config, dict) or "model" not in config:
        raise RepoError(f"{where} has no `model` section")
    return config


def steps_done(path: str | Path) -> int:
    """The optimizer steps an OLMo-core checkpoint was saved after: `global_step` of the trainer state that
    OLMo-core's Trainer writes beside a run's step (`train/rank0.pt`, read with the full loader as OLMo-core's
    resume reads it: the file holds the data loader's and RNG state too); 0 for a model-only checkpoint, which
    has none (a run's start)."""
    file = Path(path) / "train" / "rank0.pt"
    if not file.is_file():
        return 0
    return int(torch.load(file, map_location="cpu", weights_only=False)["global_step"])


def model_config(path: str | Path) -> TransformerConfig:
    """The `TransformerConfig` of an OLMo-core checkpoint."""
    return TransformerConfig.from_dict(read_config(path)["model"])


def load_model(path: str | Path, config: TransformerConfig | None = None) -> Transformer:
    """The model of an OLMo-core checkpoint on the CPU, every weight loaded strictly (dtype as configured)."""
    config = config or model_config(path)
    read_metadata(Path(path) / MODEL_AND_OPTIM)  # whole, before the load
    model = config.build(init_device="cpu")
    with _one_process():
        load_model_and_optim_state(Path(path) / MODEL_AND_OPTIM, model, strict=True)
    return model


def save_model(model: Transformer, config: dict[str, Any], out: Path) -> None:
    """Write a model-only OLMo-core checkpoint of `model` into the (new, empty) directory `out`."""
    with _one_process():
        save_model_and_optim_state(out / MODEL_AND_OPTIM, model)
    (out / CONFIG).write_text(json.dumps(config, indent=2))


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """Without torch's warning that a checkpoint is read or written in one process where no process group is up
    ("torch.distributed is disabled, ... assuming the intent is to load in a single process"): a converter's one
    process is the intent (each conversion printed it once or twice)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights by OLMo-core name (a tied output layer once, under both names)."""
    return {k: v.detach() for k, v in model.state_dict().items()}
