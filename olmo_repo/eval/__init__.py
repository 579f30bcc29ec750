"""Measuring what RePo learned and what it is for (the commands are `olmo_repo.cli.eval` and
`olmo_repo.cli.plot_positions`).

- `variants`: the NIAH variants and constants (RULER's seed and sample count), and the parsing of the
  evaluation's flags, light enough for the commands' argument parsing.
- `request`: `scripts/eval.py`'s work: check a request, evaluate it length by length, write its results.
- `niah`: RULER needle-in-a-haystack, offline (`essays`: the offline haystack).
- `ruler`: RULER's synthetic tasks, bounded by the sample count and checked against their shortest length.
- `suite`: the paper's evaluation suite as lm-eval task groups (`lm_eval_tasks/`).
- `inloop_rows`: in-loop NIAH without a trainer (rows, metric, batches), which both trainers' in-loop evaluators
  read (`olmo_repo.ai2olmo.niah`, `olmo_repo.olmocore.niah`).
- `loading`: a model at a target length, with YaRN past its training length.
- `positions`: chunk patterns (constant / monotonic / hybrid) and spans of the learned positions.
- `attention`: attention mass on needle / query / other tokens of NIAH prompts.
- `plots`, `analysis`, `report`: figures (PNG), report sections, the Markdown report.
"""
