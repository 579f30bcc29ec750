"""`scripts/core_convert_from_hf.py`: a Hugging Face directory -> a model-only OLMo-core checkpoint (.venv-core)."""

from __future__ import annotations

from pathlib import Path

from . import command, from_hf_command

__all__ = ["main"]


def _convert(input: str, output: str, force: bool) -> Path:
    from ..olmocore.hf import hf_to_core

    return hf_to_core(input, output, force=force)


@command
def main(argv: list[str] | None = None) -> int:
    description = (
        "Convert an HF olmo2 / repo_olmo2 / olmo3 / repo_olmo3 / reference-format / llama / repo_llama / qwen3 "
        "/ repo_qwen3 directory to a model-only OLMo-core checkpoint (model_and_optim/, config.json, "
        "tokenizer.json): the load_path of a configs/olmocore run (a stock model's weights only: a RePo config "
        "creates f_phi at its init)."
    )
    return from_hf_command(
        "core_convert_from_hf.py", description, "checkpoint directory", _convert, argv, "olmo-core"
    )
