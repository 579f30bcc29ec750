"""Writing outputs so that a failure leaves nothing behind and an overwrite loses nothing of the user's.

- `write_file`: write a file whole or not at all (a temporary file beside it, renamed into place).
- `staged_dir`: write a folder whole or not at all.
- `check_replaceable` / `check_replaceable_file`: what `--force` (or `--overwrite`) may replace. A folder is
  this project's output when every entry in it has a name this project writes (`OUTPUT_NAMES`,
  `OUTPUT_FOLDERS`: an HF conversion, an unsharded or model-only OLMo-core checkpoint, an eval's results); anything else in it is the user's, and the
  overwrite is refused with one line naming those files. Recognising outputs by name (rather than by a
  marker) also accepts what earlier versions wrote.
- `check_distinct`: an output is not its own input.
- `file_stem`: a display name as a file name that links need not quote.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path

from .errors import RepoError
from .paths import is_url

__all__ = [
    "OUTPUT_FOLDERS",
    "OUTPUT_NAMES",
    "PNG_SIGNATURE",
    "check_distinct",
    "check_replaceable",
    "check_replaceable_file",
    "file_stem",
    "foreign_entries",
    "remove_partials",
    "staged_dir",
    "write_file",
]

# Every name this project writes into an output folder (fnmatch patterns, top level only).
OUTPUT_NAMES = (
    # an HF directory (convert_to_hf, the demo's base model): transformers' files, the remote code
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "configuration_repo_olmo2.py",
    "modeling_repo_olmo2.py",
    "configuration_repo_olmo3.py",
    "modeling_repo_olmo3.py",
    "configuration_repo_llama.py",
    "modeling_repo_llama.py",
    "configuration_repo_qwen3.py",
    "modeling_repo_qwen3.py",
    "rope.py",
    "rotation.py",
    "modes.py",
    # an unsharded OLMo checkpoint (convert_from_hf, unshard)
    "config.yaml",
    "model.pt",
    "optim.pt",
    "train.pt",
    # scripts/tokenize_text.py's token file (beside the tokenizer.json it was made with)
    "train.npy",
    # scripts/eval.py's results
    "results.json",
    "results.md",
    "samples.jsonl",
)
OUTPUT_FOLDERS = ("model_and_optim",)
"""The sub-folders this project writes into an output folder: a model-only OLMo-core checkpoint's weights
(scripts/core_convert_from_hf.py; beside its config.json and tokenizer.json)."""


def foreign_entries(folder: str | PathLike) -> list[str]:
    """The names in `folder` that this project does not write (sorted; a sub-folder ends with '/')."""
    return sorted(
        entry.name + ("/" if entry.is_dir() else "")
        for entry in Path(folder).iterdir()
        if (
            entry.name not in OUTPUT_FOLDERS
            if entry.is_dir()
            else not any(fnmatch.fnmatchcase(entry.name, p) for p in OUTPUT_NAMES)
        )
    )


def check_replaceable(output: str | PathLike, force: bool) -> None:
    """Raise unless `output` may be (re)written: absent, or with `force` a folder of this project's outputs.

    FileExistsError when it exists without `force`; `RepoError` naming the files that would be lost when it
    is a file or a folder holding anything else.
    """
    output = Path(output)
    if not output.exists() and not output.is_symlink():
        return
    if not force:
        raise FileExistsError(f"{output} exists; pass --force to replace it")
    if not output.is_dir() or output.is_symlink():
        raise RepoError(
            f"{output} is a file, not an output folder of this project; --force does not replace it"
        )
    if foreign := foreign_entries(output):
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise RepoError(
            f"{output} holds files this project does not write ({shown}); --force would lose them: move them "
            "away or choose another output folder"
        )


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
"""The first bytes of every PNG (the figures this project writes)."""


def check_replaceable_file(output: str | PathLike, force: bool, signature: bytes, kind: str) -> None:
    """Raise unless the file `output` may be (re)written: absent, or with `force` a file that starts with
    `signature` (what this project writes there, e.g. a PNG's magic number). `kind` names it in the error."""
    output = Path(output)
    if not output.exists() and not output.is_symlink():
        return
    if not force:
        raise FileExistsError(f"{output} exists; pass --force to replace it")
    if output.is_dir():
        raise RepoError(f"{output} is a folder; name a {kind} file to write")
    with open(output, "rb") as f:
        head = f.read(len(signature))
    if head != signature:
        raise RepoError(
            f"{output} is not a {kind} this project wrote; --force would lose it: move it away or choose "
            "another file name"
        )


def file_stem(name: str) -> str:
    """`name` with every run of characters other than letters, digits, `.`, `_` and `-` as one `-`: "RePo,
    learning" -> "RePo-learning" (a Markdown link to a file with a space or a comma does not render)."""
    return re.sub(r"[^\w.-]+", "-", name).strip("-")


def write_file(path: str | PathLike, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` whole or not at all; returns `path`.

    The bytes go to a temporary file beside `path` (`.NAME.partial-XXXX`), flushed to disk, which then replaces
    `path` in one rename: a kill, a full disk or a crash leaves the earlier file (or none), never a part. The
    file keeps the permissions of the one it replaces; a new one gets the user's umask. Concurrent writers
    each have their own temporary file; the last rename wins.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
    staged = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()  # mkstemp makes the file 0600, whatever the umask
        staged.chmod(mode)
        staged.replace(path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return path


def remove_partials(path: str | PathLike) -> None:
    """Remove the temporary files `write_file(path, ...)` left when its process was killed mid-write
    (`.NAME.partial-XXXX` beside `path`: this project's by their name). For a rerun of the command that writes
    `path`, not while another process may be writing it."""
    path = Path(path)
    for partial in path.parent.glob(f".{glob.escape(path.name)}.partial-*"):
        if partial.is_file():
            partial.unlink(missing_ok=True)


@contextmanager
def staged_dir(output: str | PathLike, force: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `output`; on success it replaces `output`, on failure it is removed.

    An existing `output` is replaced only with `force` and only if it holds nothing but this project's
    outputs (`check_replaceable`). The replacement is one atomic exchange where the file system offers it
    (Linux `renameat2`), so that a kill at any moment leaves either the old folder or the new one under the
    name `output`.
    """
    output = Path(output)
    check_replaceable(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        yield staging
        check_replaceable(output, force)  # again: the folder may have changed while the output was written
        _apply_umask(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not output.exists():
        staging.rename(output)
    elif _exchange(staging, output):
        shutil.rmtree(staging)  # the old output, now under the staging name
    else:
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        output.rename(old)
        staging.rename(output)
        shutil.rmtree(old)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one step (`renameat2(RENAME_EXCHANGE)`); False where the C library or the
    file system cannot (the caller then renames twice)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # not glibc >= 2.28 (macOS, musl)
        return False
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h>, <linux/fs.h>
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # a file system without exchange
        return False
    raise OSError(code, os.strerror(code), str(b))


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _apply_umask(root: Path) -> None:
    """Give the output the permissions of anything else the user creates: mkdtemp makes the folder 0700, and
    transformers writes safetensors through a private temporary file (0600), whatever the umask."""
    umask = _umask()
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def check_distinct(input: str | PathLike, output: str | PathLike) -> None:
    """ValueError if `output` is the (local) `input` itself."""
    if not is_url(input) and Path(input).resolve() == Path(output).resolve():
        raise ValueError(f"--output {output} is the input directory")
