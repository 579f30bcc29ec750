"""`scripts/convert_from_hf.py`: a Hugging Face Olmo2 directory -> an unsharded OLMo checkpoint."""

from __future__ import annotations

import argparse

from ..integrity import require_model_dir
from . import run

__all__ = ["main"]

PROG = "convert_from_hf.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a Hugging Face Olmo2 directory (stock, e.g. an OLMo-2 stage-1 revision; this "
        "project's repo_olmo2; or the reference implementation's format) to an unsharded OLMo checkpoint "
        "(config.yaml, model.pt, train.pt) usable as load_path (with reset_optimizer_state: true).",
    )
    parser.add_argument("--input", required=True, help="local HF directory (config.json + safetensors)")
    parser.add_argument(
        "--output", required=True, help="checkpoint directory to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)

    def convert() -> None:
        require_model_dir(args.input)  # missing or damaged: said before torch loads
        from ..hf.convert import convert_from_hf

        print(f"wrote {convert_from_hf(args.input, args.output, force=args.force)}")

    return run(PROG, convert)
