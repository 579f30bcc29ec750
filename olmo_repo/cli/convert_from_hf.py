"""`scripts/convert_from_hf.py`: a Hugging Face Olmo2 directory -> an unsharded OLMo checkpoint."""

from __future__ import annotations

import argparse

from ..errors import RepoError
from . import fail

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
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
    from huggingface_hub.errors import StrictDataclassError
    from olmo.exceptions import OLMoError

    from ..hf.convert import convert_from_hf

    try:
        out = convert_from_hf(args.input, args.output, force=args.force)
    except (OSError, ValueError, KeyError, StrictDataclassError, OLMoError, RepoError) as e:
        return fail("convert_from_hf.py", e)
    print(f"wrote {out}")
    return 0
