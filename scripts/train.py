"""Train with OLMo's Trainer and the RePo model: `torchrun scripts/train.py CONFIG [--key=value ...]`. See `--help`."""

from olmo_repo.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main())
