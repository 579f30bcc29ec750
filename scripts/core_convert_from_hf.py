"""Hugging Face directory -> model-only OLMo-core checkpoint (run in .venv-core). See `--help`."""

from olmo_repo.cli.core_convert_from_hf import main

if __name__ == "__main__":
    raise SystemExit(main())
