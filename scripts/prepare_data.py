"""Tokenise corpora with a model's own tokenizer into the token shards a run reads. See `--help`."""

from olmo_repo.cli.prepare_data import main

if __name__ == "__main__":
    raise SystemExit(main())
