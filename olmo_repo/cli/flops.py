"""`scripts/flops.py`: a Markdown table of parameters and training FLOPs for training configs."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import RepoError
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
        from ..flops import parameter_count
        from ..tables import markdown_table

        rows = []
        for path in args.configs:
            count = parameter_count(_model_config(path))
            rows.append(
                [
                    path,
                    f"{count.non_embedding:,}",
                    f"{count.repo:,}",
                    f"{100 * count.repo_overhead:.3g}%",
                    _sci(count.training_flops(args.tokens, with_repo=False)),
                    _sci(count.training_flops(args.tokens)),
                ]
            )
        print(f"Training FLOPs at {_sci(args.tokens)} tokens (6 N D, N = non-embedding parameters)\n")
        print(markdown_table(["config", "N", "f_phi", "f_phi / rest", "FLOPs without f_phi", "FLOPs"], rows))

    return run(PROG, table)


def _model_config(path: str) -> Any:
    """The model of the training config `path`; RepoError naming the file when it cannot be read."""
    from olmo.exceptions import OLMoConfigurationError

    from ..config import RepoTrainConfig

    try:
        return RepoTrainConfig.load(path, validate_paths=False).model
    except (FileNotFoundError, OLMoConfigurationError, ValueError) as e:
        raise RepoError(f"{path}: {e}") from None


def _sci(x: float) -> str:
    return f"{x:.3g}".replace("e+", "e")
