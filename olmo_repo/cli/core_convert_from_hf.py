"""`scripts/core_convert_from_hf.py`: a Hugging Face directory -> a model-only OLMo-core checkpoint (.venv-core)."""

from __future__ import annotations

import argparse

from ..errors import RepoError
from . import fail

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Convert an HF olmo2 / repo_olmo2 / olmo3 / repo_olmo3 / reference-format directory to a "
        "model-only OLMo-core "
        "checkpoint (model_and_optim/, config.json, tokenizer.json): the load_path of a configs/olmocore run."
    )
    parser.add_argument("--input", required=True, help="HF directory (config.json and safetensors)")
    parser.add_argument(
        "--output", required=True, help="checkpoint directory to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)
    from ..olmocore.hf import hf_to_core

    try:
        out = hf_to_core(args.input, args.output, force=args.force)
    except (RepoError, OSError, ValueError) as e:
        return fail("core_convert_from_hf.py", e)
    print(f"wrote {out}")
    return 0
