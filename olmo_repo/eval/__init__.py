"""Measuring what RePo learned: position patterns and spans (`positions`), and lm-eval tasks (`lm_eval_tasks/`)."""
