"""The paper's recipe at CPU scale on SmolLM2-135M: RePo from layer 10 vs RoPE, with a report. See `--help`."""

from olmo_repo.cli.smollm2_recipe import main

if __name__ == "__main__":
    raise SystemExit(main())
