"""Hugging Face Olmo2 directory -> unsharded OLMo checkpoint. See `--help`."""

from olmo_repo.hf.cli import convert_from_hf_main

if __name__ == "__main__":
    raise SystemExit(convert_from_hf_main())
