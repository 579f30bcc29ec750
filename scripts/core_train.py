"""Train with OLMo-core's Trainer from a config of configs/olmocore/ (run in .venv-core). See `--help`."""

from olmo_repo.cli.core_train import main

if __name__ == "__main__":
    raise SystemExit(main())
