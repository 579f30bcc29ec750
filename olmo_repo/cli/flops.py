"""`scripts/flops.py`: a Markdown table of parameters and training FLOPs for training configs."""

from __future__ import annotations

import argparse

from . import fail

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Parameters and training FLOPs (6 N D, N without the input embedding: the paper's "
        "convention) of training configs; for configs with RePo layers also without f_phi (= the RoPE model)."
    )
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="training config YAML files")
    parser.add_argument(
        "--tokens", type=float, default=50e9, help="training tokens D (default: 50e9, the paper's stage 2)"
    )
    args = parser.parse_args(argv)
    from olmo.exceptions import OLMoConfigurationError

    from ..config import RepoTrainConfig
    from ..flops import parameter_count
    from ..tables import markdown_table

    rows = []
    for path in args.configs:
        try:
            config = RepoTrainConfig.load(path, validate_paths=False).model
        except (FileNotFoundError, OLMoConfigurationError, ValueError) as e:
            return fail("flops.py", f"{path}: {e}")
        count = parameter_count(config)
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
    return 0


def _sci(x: float) -> str:
    return f"{x:.3g}".replace("e+", "e")
