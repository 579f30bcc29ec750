"""`scripts/flops.py`: a Markdown table of parameters and training FLOPs for training configs."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import run

__all__ = ["main"]

PROG = "flops.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Parameters and training FLOPs (6 N D, N without the input embedding: the paper's "
        "convention) of training configs; for configs with RePo layers also without f_phi (= the RoPE model).",
    )
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="training config YAML files")
    parser.add_argument(
        "--tokens", type=float, default=50e9, help="training tokens D (default: 50e9, the paper's stage 2)"
    )
    args = parser.parse_args(argv)

    def table() -> None:
        for config in args.configs:  # before the imports, which take seconds
            if "://" not in config and not Path(config).is_file():
                raise FileNotFoundError(f"config file {config} does not exist")
        from ..flops import flops_table

        print(flops_table(args.configs, args.tokens))

    return run(PROG, table)
