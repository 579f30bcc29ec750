"""`make demo`: a tiny RePo continual pre-training on CPU and its report (`olmo_repo.cli.demo`)."""

from olmo_repo.cli.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
