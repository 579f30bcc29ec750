"""A model directory of this project, as the commands take it: `as_hf_dir` and `load_model`.

Evaluation, the analyses and the explorer read Hugging Face directories only (`olmo_repo.eval`, `olmo_repo.explore`
import no trainer); the commands give them one through `as_hf_dir`, which is where a trainer's checkpoint meets
them:

- an HF directory (config.json: this project's, a stock model's, the reference's format) is used as it is;
- an unsharded ai2-olmo checkpoint of this project (config.yaml + model.pt; local, http(s) or s3) is converted
  into a temporary directory (`olmo_repo.ai2olmo.hf.convert_to_hf`), removed on exit; where ai2-olmo is not
  installed (the vLLM and OLMo-core environments) it is refused in one line naming `scripts/convert_to_hf.py`;
- an OLMo-core checkpoint is refused in one line naming `scripts/core_convert_to_hf.py` (its environment,
  `.venv-core`, is not evaluation's).

`load_model(dir)` is ai2-olmo's (`olmo_repo.ai2olmo.checkpoint`), here under its public name. Nothing here loads
ai2-olmo until a checkpoint needs it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import RepoError, command, install
from .integrity import require_model_dir
from .paths import is_url

if TYPE_CHECKING:
    from olmo.model import OLMo

__all__ = ["as_hf_dir", "load_model"]


@contextmanager
def as_hf_dir(path: str | PathLike, *, tokenizer: str | None = None) -> Iterator[Path]:
    """Yield an HF directory for `path` (see the module docstring); `tokenizer` overrides the one an ai2-olmo
    checkpoint's config names. Raises FileNotFoundError naming `path` when it is not a model directory, and
    `CorruptFileError` naming a damaged file, before anything loads."""
    require_model_dir(path)
    if not is_url(path) and (Path(path) / "config.json").is_file():
        yield Path(path)
        return
    try:
        from .ai2olmo.hf import convert_to_hf  # ai2-olmo: only an ai2-olmo checkpoint needs it
    except ModuleNotFoundError as e:  # the vLLM and OLMo-core environments have no ai2-olmo
        raise RepoError(
            f"{path} is an ai2-olmo checkpoint and this environment has no ai2-olmo ({e.name} is missing): convert "
            f"it with {command('convert_to_hf')} where ai2-olmo is installed ({install('ai2-olmo')}) and pass "
            "the HF directory"
        ) from None

    with tempfile.TemporaryDirectory(prefix="olmo-repo-hf-") as tmp:
        yield convert_to_hf(path, Path(tmp) / "hf", tokenizer=tokenizer)


def load_model(checkpoint_dir: str | PathLike, device: str = "cpu") -> OLMo:
    """Build the model of an unsharded ai2-olmo checkpoint of this project and load its weights strictly; in eval
    mode (`olmo_repo.ai2olmo.checkpoint.load_model`)."""
    from .ai2olmo.checkpoint import load_model as load

    return load(checkpoint_dir, device)
