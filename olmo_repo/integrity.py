"""Is a checkpoint or weights file intact? Read from its directory or header alone, cheap for any size.

Standard library only: evaluation, the explorer and the converters check files before loading them without
importing torch or OLMo (`require_model_dir`: what a model directory of the commands is). Truncation, the usual
damage, always shows in a torch.save file's zip directory or a safetensors header.
"""

from __future__ import annotations

import json
import logging
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from os import PathLike
from pathlib import Path

from .errors import CorruptFileError, command
from .paths import is_url

__all__ = [
    "OLMO_CORE_CHECKPOINT",
    "ModelOpener",
    "checkpoint_problems",
    "file_problem",
    "hf_dir_as_is",
    "latest_intact",
    "olmo_core_checkpoint_problem",
    "require_intact",
    "require_model_dir",
]

log = logging.getLogger(__name__)

OLMO_CORE_CHECKPOINT = "model_and_optim"
"""The folder of an OLMo-core checkpoint (torch.distributed.checkpoint shards), beside its config.json."""


def olmo_core_checkpoint_problem(path: str | PathLike, convert: str) -> str | None:
    """What to do, if `path` is an OLMo-core checkpoint where this trainer's (or an HF directory) is needed:
    `convert` names the command that converts it."""
    if not is_url(path) and (Path(path) / OLMO_CORE_CHECKPOINT).is_dir():
        return f"{path} is an OLMo-core checkpoint ({OLMO_CORE_CHECKPOINT}/): convert it first with {convert}"
    return None


def file_problem(path: str | PathLike) -> str | None:
    """Why a torch.save (zip) or safetensors file cannot be read, from its directory or header alone (cheap
    for any size); None if it looks intact. Truncation, the usual damage, always shows there."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if path.suffix == ".safetensors":
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            return None if 8 + length + end <= size else f"truncated: {size:,} of {8 + length + end:,} bytes"
        with zipfile.ZipFile(path) as archive:
            end = max((i.header_offset + i.compress_size for i in archive.infolist()), default=0)
        return None if end <= size else f"truncated: {size:,} of more than {end:,} bytes"
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile) as e:
        return f"truncated or not a {'safetensors' if path.suffix == '.safetensors' else 'torch.save'} file ({e})"


def require_intact(path: str | PathLike) -> None:
    """FileNotFoundError if `path` does not exist; `CorruptFileError` naming it if it is damaged."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if (problem := file_problem(path)) is not None:
        raise CorruptFileError(f"{path} cannot be read, {problem}: restore it from a copy or re-create it")


def checkpoint_problems(directory: str | PathLike, required: tuple[str, ...] = ()) -> list[str]:
    """`FILE: problem` for the `required` files (model.pt may be model.safetensors) and every other *.pt or
    *.safetensors file of a local checkpoint directory, sharded or not."""
    directory = Path(directory)
    files = {p for p in directory.rglob("*") if p.suffix in (".pt", ".safetensors") and p.is_file()}
    for name in required:
        if name == "model.pt" and (directory / "model.safetensors").is_file():
            name = "model.safetensors"
        files.add(directory / name)
    return [f"{f}: {problem}" for f in sorted(files) if (problem := file_problem(f)) is not None]


def require_model_dir(path: str | PathLike, tokenizer: bool = False) -> None:
    """Check a model the commands load (an HF directory: every *.safetensors; an unsharded OLMo checkpoint:
    model.pt) before torch loads: FileNotFoundError if it is not there or not a model directory,
    `CorruptFileError` naming the first damaged file. URLs are left to the loader. With `tokenizer` (a command
    that loads the HF directory's tokenizer with transformers) its tokenizer.json needs its tokenizer_config.json:
    without it transformers loads a tokenizer that knows no special token, and generation fails far later."""
    if is_url(path):
        return
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"{path}: not a model directory: it does not exist")
    to_hf = f"{command('core_convert_to_hf')} --input CHECKPOINT --output DIR (an HF directory every command takes)"
    if problem := olmo_core_checkpoint_problem(path, to_hf):
        raise FileNotFoundError(problem)
    if (directory / "config.json").is_file():
        files = sorted(directory.glob("*.safetensors"))
        if tokenizer and (directory / "tokenizer.json").is_file():
            if not (directory / "tokenizer_config.json").is_file():
                raise FileNotFoundError(
                    f"{path} has a tokenizer.json but no tokenizer_config.json (its tokenizer's class and special "
                    "tokens, which transformers reads with it): copy the model's tokenizer_config.json beside it"
                )
    elif (directory / "config.yaml").is_file() and (directory / "model.pt").is_file():
        files = [directory / "model.pt"]
    else:
        raise FileNotFoundError(
            f"{path}: not a model directory; expected a Hugging Face directory (config.json) or an unsharded "
            "OLMo checkpoint of this project (config.yaml and model.pt)"
        )
    for file in files:
        require_intact(file)


def latest_intact(
    folder: str | PathLike,
    newest_first: Iterable[Path],
    problems: Callable[[Path], list[str]],
    move_aside: bool = True,
) -> Path | None:
    """The first of a run folder's checkpoints (`newest_first`) without `problems`: the one a resume loads,
    both trainers' rule. With `move_aside` (one process of a run does it) the newer corrupt ones are moved
    aside to `NAME.corrupt` (never deleted), each with a warning, so that training writes that step again;
    None for no checkpoint; `CorruptFileError` when every one is corrupt."""
    corrupt: list[tuple[Path, list[str]]] = []
    for path in newest_first:
        if why := problems(path):
            corrupt.append((path, why))
            continue
        for bad, reasons in corrupt if move_aside else []:
            aside = _free_name(bad.with_name(bad.name + ".corrupt"))
            bad.rename(aside)
            log.warning(
                "%s is corrupt (%s): moved aside to %s; resuming from %s",
                bad,
                "; ".join(reasons),
                aside,
                path,
            )
        return path
    if corrupt:
        listed = "; ".join(f"{p.name}: {'; '.join(why)}" for p, why in corrupt)
        raise CorruptFileError(
            f"no intact checkpoint in {folder} to resume from ({listed}): restore one from a copy, or move them "
            "away to start the run afresh"
        )
    return None


def _free_name(path: Path) -> Path:
    """`path`, or `path.2`, `path.3`, ... : the first that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


ModelOpener = Callable[[str], AbstractContextManager[Path]]
"""How evaluation, the analyses and the explorer open a model the user named: a context manager yielding its HF
directory. Theirs by default is `hf_dir_as_is`; the commands pass `olmo_repo.checkpoint.as_hf_dir`, which also
converts a trainer's checkpoint (evaluation imports no trainer)."""


@contextmanager
def hf_dir_as_is(path: str | PathLike) -> Iterator[Path]:
    """Yield `path`, a Hugging Face directory (config.json), as it is; FileNotFoundError naming it otherwise."""
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: not a Hugging Face directory (no config.json); a trainer's checkpoint is opened through "
            "olmo_repo.checkpoint.as_hf_dir (what the commands do)"
        )
    yield Path(path)
