"""OLMo checkpoint (or reference-format HF dir) -> Hugging Face directory. See `--help`."""

from olmo_repo.cli.convert_to_hf import main

if __name__ == "__main__":
    raise SystemExit(main())
