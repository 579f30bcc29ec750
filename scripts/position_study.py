"""docs/research.md's study of learning positions on one machine, in one command. See `--help`."""

from olmo_repo.cli.position_study import main

if __name__ == "__main__":
    raise SystemExit(main())
