"""`make demo-base`: rebuild the tiny base model that `make demo` starts from (olmo_repo/experiments/demo/base_model/,
shipped in the package): its tokenizer and corpus, RoPE pre-training on CPU (tiny-base-rope.yaml; docs/demo.md
says how long it takes), and the conversion to HF in bf16. See olmo_repo/experiments/demo/base.py for why the demo starts
from a shipped model."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import RepoError
from . import command, run

__all__ = ["main"]

PROG = "demo_base.py"


@command
def main(argv: list[str] | None = None) -> int:
    import yaml  # light (the config's sizes, not torch), and in the base install: --help needs no extra

    from ..experiments.demo import BASE_DIR, config_path

    config = yaml.safe_load(config_path("base-rope").read_text())
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("runs/demo-base"),
        help="folder for the corpus, the training run and its log: a new or empty folder, or a previous "
        "build's, whose outputs are replaced (default: runs/demo-base in the current directory)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="where the HF model goes (default: olmo_repo/experiments/demo/base_model/ in the package, which `make demo` "
        "uses); a folder holding other files than a previous build's is refused",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps of {config['global_train_batch_size']} windows of {config['model']['max_sequence_length']} "
        f"tokens, and the corpus size to match (default: {config['max_duration']:,}, the config's; fewer for a "
        "quick try)",
    )
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")

    def build() -> None:
        # after --help and argument errors: torch takes seconds
        from ..experiments.demo.base import BASE_STEPS, build_base

        build_base(args.work.resolve(), (args.output or BASE_DIR).resolve(), args.steps or BASE_STEPS)

    return run(PROG, build, lambda: (RepoError,), needs=("ai2-olmo",))


if __name__ == "__main__":
    raise SystemExit(main())
