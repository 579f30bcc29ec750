"""Parameters and training FLOPs (6 N D) of training configs. See `--help`."""

from olmo_repo.cli.flops import main

if __name__ == "__main__":
    raise SystemExit(main())
