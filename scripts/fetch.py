"""Fetch the data, checkpoint and evaluation files a training config reads remotely. See `--help`."""

from olmo_repo.cli.fetch import main

if __name__ == "__main__":
    raise SystemExit(main())
