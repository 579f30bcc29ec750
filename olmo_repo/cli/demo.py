"""`make demo`: build a tiny corpus offline, continue the shipped tiny base model with RoPE on CPU, then with
RePo and with RoPE through `olmo_repo.cli.train`, print a table and write report.md (see README.md, "make
demo")."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import RepoError
from . import fail

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=Path("runs/demo"),
        metavar="OUT_DIR",
        help="folder for the demo's outputs (corpus, three runs, their logs, the report): a new or empty "
        "folder, or a previous demo's, whose outputs are replaced while other files in it stay (default: "
        "runs/demo in the current directory)",
    )
    args = parser.parse_args(argv)
    from ..demo.run import run_demo  # after --help and argument errors: the demo imports torch and OLMo

    try:
        run_demo(args.out_dir)
    except RepoError as e:
        return fail(parser.prog, e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
