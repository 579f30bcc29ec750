"""The SmolLM2 recipe (`scripts/smollm2_recipe.py`): the paper's recipe at CPU scale on a real pretrained model,
continued on OLMo-core in arms that are overrides of one config.

    options   Arm (a label, a folder name and overrides of the config), the recipe's and the study's arms,
              Recipe (the options), RunConfig (what the config says of an arm's run)
    recipe    the stages (model, data, stage-1 checkpoint, one training run per arm, HF conversions, held-out
              losses, evaluation) on `olmo_repo.experiments.stages`
    heldout   held-out loss and positions of an HF model on the held-out text
    report    report.md from what the stages recorded
"""
