"""docs/research.md's study of learning positions on one machine, in one command (`scripts/position_study.py`):
the SmolLM2 recipe's arms (`olmo_repo.experiments.smollm2.recipe.STUDY_ARMS`) and tiny models trained from scratch on recall among
distractors (`retrieval`, `scratch`), each a resumable stage of one folder (`run`)."""
