"""`make demo`: build a tiny corpus offline, pre-train a tiny RoPE model on CPU, continue it with RePo and
with RoPE through scripts/train.py, and print a table (see README.md, "Training")."""

import argparse
from pathlib import Path

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "out_dir",
        nargs="?",
        metavar="OUT_DIR",
        help="folder for the demo's outputs (corpus, three runs, their logs): a new or empty folder, or a "
        "previous demo's, whose outputs are replaced while other files in it stay (default: runs/demo in the "
        "repository)",
    )
    args = parser.parse_args()
    from olmo_repo.demo import run_demo  # after --help: importing torch and OLMo takes seconds

    if args.out_dir is None:
        run_demo()
    else:
        run_demo(Path(args.out_dir).resolve())
