"""The project's error: library code raises it (or a subclass), and the commands in `olmo_repo.cli` turn it
into one line on stderr and an exit code; and how those lines name a command or an install, which depends on how
olmo-repo was installed (`in_checkout`): a checkout's user runs `scripts/*.py` in the Makefile's environments, a
pip user runs the console scripts and installs extras. Standard library only."""

from __future__ import annotations

import importlib.util
import traceback
from collections.abc import Iterable
from difflib import get_close_matches
from functools import cache
from pathlib import Path

__all__ = [
    "EXTRAS",
    "CorruptFileError",
    "RepoError",
    "command",
    "extras_missing",
    "in_checkout",
    "install",
    "missing_extra",
    "not_a_key",
    "not_a_length",
]


class RepoError(Exception):
    """A problem with the user's input or environment, said in one line that names the file or key."""


class CorruptFileError(RepoError):
    """A checkpoint or weights file that is missing, truncated or not what its name says."""


def not_a_key(full_key: str, known: Iterable[str], owner: str) -> str:
    """The one line for a config key `full_key` (dotted) whose last part is none of `known`, the keys of
    `owner` (a config class): the nearest one named, or the class. Both trainers' configs and overrides say
    it so."""
    prefix, _, name = full_key.rpartition(".")
    match = get_close_matches(name, list(known), n=1, cutoff=0.6)
    if match:
        return f"{full_key} is not a config key; did you mean {prefix + '.' if prefix else ''}{match[0]}?"
    return f"{full_key} is not a config key (not in '{owner}')"


def not_a_length(key: str, value: object) -> str:
    """The one line for a training length `key` (dotted) that is no positive number of tokens: both trainers'
    configs and overrides say it so, before anything divides by it."""
    return f"{key}={value} is not a training length: pass a whole number of tokens, at least 1"


@cache
def in_checkout() -> bool:
    """Whether olmo_repo runs from a checkout of the repository (scripts/, the Makefile and its environments
    beside the package; an editable install too), not from an installed wheel."""
    root = Path(__file__).resolve().parents[1]
    return (root / "pyproject.toml").is_file() and (root / "scripts").is_dir()


def command(script: str) -> str:
    """What a user types for `scripts/<script>.py`: that path in a checkout, its console script
    (`olmo-repo-<script>`, underscores as dashes) where the package is installed."""
    return f"scripts/{script}.py" if in_checkout() else f"olmo-repo-{script.replace('_', '-')}"


EXTRAS = {
    "olmo": "ai2-olmo",
    "omegaconf": "ai2-olmo",
    "cached_path": "ai2-olmo",
    "requests": "ai2-olmo",
    "olmo_core": "olmo-core",
    "lm_eval": "eval",
    "nltk": "eval",
    "wonderwords": "eval",
    "datasets": "eval",
    "matplotlib": "eval",
    "fastapi": "explore",
    "uvicorn": "explore",
    "plotly": "explore",
    "jinja2": "explore",
    "vllm": "vllm",
    "datatrove": "data",
}
"""The package (top-level import name) -> the extra of pyproject.toml that brings it, for the packages that one
extra alone brings."""

_SHARED = ("wandb", "boto3", "botocore", "torchmetrics", "tqdm", "pandas", "pyarrow", "sklearn", "accelerate")
"""Packages that several extras bring: the extra is that of the part of olmo_repo that imported it (`_SIDES`)."""

_SIDES = {"ai2olmo": "ai2-olmo", "demo": "ai2-olmo", "olmocore": "olmo-core", "eval": "eval",
          "explore": "explore", "vllm": "vllm"}  # fmt: skip

_ENVIRONMENTS = {"ai2-olmo": (".venv", "install"), "olmo-core": (".venv-core", "install-core"),
                 "vllm": (".venv-vllm", "install-vllm"), "data": (".venv-data", "install-data")}  # fmt: skip
"""A trainer's or vLLM's extra -> the environment of the Makefile that holds it, and its make target."""

_APART = {"ai2-olmo": "olmo-core", "olmo-core": "ai2-olmo"}  # they cannot share an environment


def install(extra: str) -> str:
    """How to get `extra`: in a checkout, the Makefile's environment that has it (or `pip install -e`); where
    the package is installed, `pip install 'olmo-repo[extra]'`."""
    if in_checkout():
        if extra in _ENVIRONMENTS:
            venv, target = _ENVIRONMENTS[extra]
            return f"run it with {venv}/bin/python (make {target})"
        return f"pip install -e '.[{extra}]'"
    apart = f", in an environment without the {_APART[extra]} extra" if extra in _APART else ""
    return f"pip install 'olmo-repo[{extra}]'{apart}"


_PROBES = {
    "ai2-olmo": ("olmo", "omegaconf"),
    "olmo-core": ("olmo_core.script_utils",),  # OLMo-core 3's: ai2-olmo's OLMo-core 0.1.0 has none
    "eval": ("lm_eval", "nltk", "matplotlib"),
    "explore": ("fastapi", "uvicorn", "plotly"),
    "vllm": ("vllm",),
    "data": ("datatrove",),
}
"""An extra -> modules it brings, found without importing them: whether it is installed."""


def extras_missing(*extras: str) -> str | None:
    """The one line for the first of `extras` that is not installed (as `missing_extra` says it), found in
    milliseconds, before a command imports torch; None when all are."""
    for extra in extras:
        for module in _PROBES[extra]:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # the parent package of a dotted name
                found = False
            if not found:
                what = "OLMo-core 3" if extra == "olmo-core" else module
                return f"needs the {extra} extra ({what} is not installed): {install(extra)}"
    return None


def missing_extra(error: ImportError) -> str | None:
    """The one line for an import that failed because an extra is not installed (which extra, how to get it:
    `install`); None when the missing module belongs to no extra (a bug, which keeps its traceback). OLMo-core
    0.1.0 (ai2-olmo's) lacks the modules of OLMo-core 3, which the olmo-core extra brings."""
    top = (error.name or "").split(".")[0]
    extra = EXTRAS.get(top) or (_importer(error) if top in _SHARED else None)
    if extra is None or (not isinstance(error, ModuleNotFoundError) and extra != "olmo-core"):
        return None
    what = "OLMo-core 3" if extra == "olmo-core" else top
    return f"needs the {extra} extra ({what} is not installed): {install(extra)}"


def _importer(error: ImportError) -> str | None:
    """The extra of the part of olmo_repo whose import failed: the innermost frame in one of `_SIDES`."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        folders = Path(frame.filename).parts[:-1]
        # olmo_repo/ai2olmo/, olmo_repo/experiments/demo/, ...
        if "olmo_repo" in folders[:-1] and folders[-1] in _SIDES:
            return _SIDES[folders[-1]]
    return None
