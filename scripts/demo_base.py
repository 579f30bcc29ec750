"""`make demo-base`: rebuild the tiny base model that `make demo` starts from (`olmo_repo.cli.demo_base`)."""

from olmo_repo.cli.demo_base import main

if __name__ == "__main__":
    raise SystemExit(main())
