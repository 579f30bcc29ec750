"""Writing an output folder so that a failure leaves nothing behind: `staged_dir`, `check_distinct`."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path

__all__ = ["check_distinct", "staged_dir"]


@contextmanager
def staged_dir(output: str | PathLike, force: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `output`; on success it replaces `output`, on failure it is removed."""
    output = Path(output)
    if output.exists() and not force:
        raise FileExistsError(f"{output} exists; pass --force (force=True) to replace it")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        yield staging
        _apply_umask(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        output.rename(old)
        staging.rename(output)
        shutil.rmtree(old)
    else:
        staging.rename(output)


def _apply_umask(root: Path) -> None:
    """Give the output the permissions of anything else the user creates: mkdtemp makes the folder 0700, and
    transformers writes safetensors through a private temporary file (0600), whatever the umask."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _apply_umask(root: Path) -> None:
    """Give the output the permissions of anything else the user creates: mkdtemp makes the folder 0700, and
    transformers writes safetensors through a private temporary file (0600), whatever the umask."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def check_distinct(input: str | PathLike, output: str | PathLike) -> None:
    if "://" not in str(input) and Path(input).resolve() == Path(output).resolve():
        raise ValueError(f"--output {output} is the input directory")
