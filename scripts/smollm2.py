"""Write SmolLM2-135M-Instruct, Q4_1 dequantised, as a local Hugging Face directory. See `--help`."""

from olmo_repo.cli.smollm2 import main

if __name__ == "__main__":
    raise SystemExit(main())
