"""Position explorer: a local page of the positions a model assigns (or a static export). See `--help`."""

from olmo_repo.cli.explore import main

if __name__ == "__main__":
    raise SystemExit(main())
