"""Measuring what RePo learned and what it is for.

- `niah`: RULER needle-in-a-haystack, offline (`essays`: the offline haystack and sentence-splitter data).
- `suite`: the paper's evaluation suite as lm-eval task groups (`lm_eval_tasks/`).
- `loading`: a model at a target length, with YaRN past its training length.
- `cli`: `scripts/eval.py`.
- `positions`: chunk patterns (constant / monotonic / hybrid) and spans of the learned positions.
- `attention`: attention mass on needle / query / other tokens of NIAH prompts.
- `plots`, `tables`, `analysis`, `plot_cli`: figures (PNG), Markdown tables, report sections, `scripts/plot_positions.py`.
"""
