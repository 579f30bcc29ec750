"""Tokenise text with a model's own tokenizer into token files for training it further. See `--help`."""

from olmo_repo.cli.tokenize_text import main

if __name__ == "__main__":
    raise SystemExit(main())
