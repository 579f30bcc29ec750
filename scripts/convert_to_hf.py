"""OLMo checkpoint (or reference-format HF dir) -> Hugging Face directory. See `--help`."""

from olmo_repo.hf.cli import convert_to_hf_main

if __name__ == "__main__":
    raise SystemExit(convert_to_hf_main())
