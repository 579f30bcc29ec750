"""`scripts/core_convert_from_hf.py`: a Hugging Face directory -> a model-only OLMo-core checkpoint (.venv-core)."""

from __future__ import annotations

import argparse

from . import check_input, run

__all__ = ["main"]

PROG = "core_convert_from_hf.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert an HF olmo2 / repo_olmo2 / olmo3 / repo_olmo3 / reference-format directory to a "
        "model-only OLMo-core checkpoint (model_and_optim/, config.json, tokenizer.json): the load_path of a "
        "configs/olmocore run.",
    )
    parser.add_argument("--input", required=True, help="HF directory (config.json and safetensors)")
    parser.add_argument(
        "--output", required=True, help="checkpoint directory to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)

    def convert() -> None:
        check_input(args.input, args.output, args.force)  # before OLMo-core loads (seconds)
        from ..olmocore.hf import hf_to_core

        print(f"wrote {hf_to_core(args.input, args.output, force=args.force)}")

    return run(PROG, convert)
