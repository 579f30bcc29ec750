"""`scripts/unshard.py`: a sharded olmo_core checkpoint of an FSDP run -> an unsharded checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..paths import is_url
from . import command, require_extras, run

__all__ = ["main"]

PROG = "unshard.py"


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Unshard a sharded checkpoint of an FSDP run (stepN/, written with sharded_checkpointer="
        "olmo_core) into an unsharded one (config.yaml, model.pt, optim.pt, train.pt), as the run's own "
        "unsharded save would have written it. No GPU and no torchrun needed. The output is what "
        "scripts/convert_to_hf.py and load_path take.",
    )
    parser.add_argument(
        "--input", required=True, help="sharded checkpoint folder: a local path, http(s):// or s3://"
    )
    parser.add_argument(
        "--output",
        required=True,
        help="unsharded checkpoint directory to write (must not exist unless --force)",
    )
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--model-only",
        action="store_true",
        help="write config.yaml and model.pt only (enough for convert_to_hf.py; skips the optimizer state, "
        "twice the model's size)",
    )
    args = parser.parse_args(argv)

    def unshard() -> None:
        # before the imports, which take seconds
        if not is_url(args.input) and not Path(args.input).is_dir():
            raise FileNotFoundError(f"--input {args.input}: no sharded checkpoint folder there")
        require_extras("ai2-olmo")
        from ..ai2olmo.unshard import unshard_checkpoint
        from ..upstream.torch import patch_torch_for_olmo

        patch_torch_for_olmo()  # train.pt holds paths and numpy RNG state
        out = unshard_checkpoint(args.input, args.output, force=args.force, model_only=args.model_only)
        print(f"wrote {out}")

    return run(PROG, unshard)
