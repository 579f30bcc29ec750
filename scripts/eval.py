"""Evaluate a model on RULER NIAH (offline) or on the paper's suite; see `--help` and docs/evaluation.md."""

from olmo_repo.cli.eval import main

if __name__ == "__main__":
    raise SystemExit(main())
