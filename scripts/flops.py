"""Parameters and training FLOPs (6 N D) of training configs. See `--help`."""

from olmo_repo.flops import flops_main

if __name__ == "__main__":
    raise SystemExit(flops_main())
