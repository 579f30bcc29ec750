"""Hugging Face Olmo2 directory -> unsharded OLMo checkpoint. See `--help`."""

from olmo_repo.cli.convert_from_hf import main

if __name__ == "__main__":
    raise SystemExit(main())
