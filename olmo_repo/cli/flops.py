"""`scripts/flops.py`: a Markdown table of parameters and training FLOPs for training configs and HF models."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..terminal import check_printed
from . import command, run

__all__ = ["main"]

PROG = "flops.py"


def _check(model: str) -> None:
    """A training config file, or an HF directory (config.json): said before the imports, which take seconds."""
    path = Path(model)
    if path.is_dir() and not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{model}: not a Hugging Face directory (no config.json); pass a training config YAML or an HF "
            "directory"
        )
    if not path.exists():
        raise FileNotFoundError(f"{model} does not exist")


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Parameters and training FLOPs (6 N D, N without the input embedding: the paper's "
        "convention) of training configs or Hugging Face models (OLMo 2/3, Llama, Qwen 3, stock or RePo); for "
        "those with RePo layers also without f_phi (= the RoPE model).",
    )
    parser.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="an ai2-olmo training config YAML file, or a Hugging Face directory (config.json; no weights read)",
    )
    parser.add_argument(
        "--tokens", type=float, default=50e9, help="training tokens D (default: 50e9, the paper's stage 2)"
    )
    args = parser.parse_args(argv)

    def table() -> None:
        for model in args.models:
            _check(model)
        from .. import flops
        from ..eval.loading import read_config

        counts = {
            model: flops.hf_parameter_count(read_config(model))
            if Path(model).is_dir()
            else flops.parameter_count(flops.training_model_config(model))
            for model in args.models
        }
        print(flops.flops_table(counts, args.tokens))
        check_printed("the table")

    configs = any(not Path(model).is_dir() for model in args.models)  # ai2-olmo configs (YAML)
    return run(PROG, table, needs=("ai2-olmo",) if configs else ())
