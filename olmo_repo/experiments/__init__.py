"""The project's experiments, above the library (an import-linter contract keeps the library from importing them):

    stages    the one stage runner: resumable stages in a folder, their records, what a rerun skips, resumes or
              redoes; every experiment writes its folder through it
    demo      `make demo` and `make demo-base`: the tiny RePo continual pre-training on CPU and its report
    smollm2   `scripts/smollm2_recipe.py`: the recipe on SmolLM2-135M, each arm a config's overrides
    study     `scripts/position_study.py`: the recipe's arms and tiny models from scratch, on one machine

Each reads the facts of its runs from their configs; the commands in `olmo_repo.cli` only parse and call.
"""
