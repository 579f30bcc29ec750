"""`scripts/convert_from_hf.py`: a Hugging Face Olmo2 directory -> an unsharded OLMo checkpoint."""

from __future__ import annotations

from pathlib import Path

from . import command, from_hf_command

__all__ = ["main"]


def _convert(input: str, output: str, force: bool) -> Path:
    from ..ai2olmo.hf import convert_from_hf

    return convert_from_hf(input, output, force=force)


@command
def main(argv: list[str] | None = None) -> int:
    description = (
        "Convert a Hugging Face Olmo2 directory (stock, e.g. an OLMo-2 stage-1 revision; this project's "
        "repo_olmo2; or the reference implementation's format) to an unsharded OLMo checkpoint (config.yaml, "
        "model.pt, train.pt) usable as load_path (with reset_optimizer_state: true)."
    )
    return from_hf_command(
        "convert_from_hf.py", description, "checkpoint directory", _convert, argv, "ai2-olmo"
    )
