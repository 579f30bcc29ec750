"""Measuring what RePo learned: attention mass on needle / query / other tokens (`attention`), position patterns
and spans (`positions`), their plots (`plots`), and lm-eval tasks (`lm_eval_tasks/`)."""
