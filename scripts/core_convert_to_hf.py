"""OLMo-core checkpoint -> Hugging Face directory (run in .venv-core). See `--help`."""

from olmo_repo.cli.core_convert_to_hf import main

if __name__ == "__main__":
    raise SystemExit(main())
