"""Sharded olmo_core checkpoint of an FSDP run -> unsharded checkpoint. See `--help`."""

from olmo_repo.cli.unshard import main

if __name__ == "__main__":
    raise SystemExit(main())
