"""`scripts/core_convert_to_hf.py`: an OLMo-core checkpoint -> a Hugging Face directory (.venv-core)."""

from __future__ import annotations

import argparse

from ..dtypes import DTYPE_NAMES
from . import check_input, command, positive_int, require_extras, run

__all__ = ["main"]

PROG = "core_convert_to_hf.py"


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert an OLMo-core checkpoint of this project (a run's stepN/ or a model-only one; the Olmo 2 "
        "or Olmo 3 shape, or a default pre-norm block: Llama, Qwen 3 with per-head q/k norms) to a Hugging Face "
        "directory: repo_olmo2 (repo_olmo3 with sliding windows, repo_llama, repo_qwen3) with its modeling code "
        "if a layer is RePo/NoPE, else olmo2 (olmo3, llama, qwen3).",
    )
    parser.add_argument(
        "--input", required=True, help="checkpoint directory with model_and_optim/ and config.json"
    )
    parser.add_argument(
        "--output", required=True, help="HF directory to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--dtype", choices=DTYPE_NAMES, default=None, help="dtype of the written weights (default: as stored)"
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json, a directory with one, or a Hub id (default: the config's)",
    )
    parser.add_argument(
        "--max-position-embeddings",
        type=positive_int,
        default=None,
        metavar="N",
        help="the sequence length the model was trained at, for a checkpoint that records none (a run's "
        "config.json and core_convert_from_hf's output record it: train_module.max_sequence_length)",
    )
    args = parser.parse_args(argv)

    def convert() -> None:
        check_input(args.input, args.output, args.force)  # before OLMo-core loads (seconds)
        require_extras("olmo-core")
        from ..olmocore.hf import core_to_hf

        out = core_to_hf(
            args.input,
            args.output,
            force=args.force,
            dtype=args.dtype,
            tokenizer=args.tokenizer,
            max_position_embeddings=args.max_position_embeddings,
        )
        print(f"wrote {out}")

    return run(PROG, convert)
