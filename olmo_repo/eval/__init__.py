"""Measuring what RePo learned and what it is for.

- `positions`: chunk patterns (constant / monotonic / hybrid) and spans of the learned positions.
- `niah`: RULER needle-in-a-haystack, offline (`essays`: the offline haystack and sentence-splitter data).
- `suite`: the paper's evaluation suite as lm-eval task groups (`lm_eval_tasks/`).
- `loading`: a model at a target length, with YaRN past its training length.
- `cli`: `scripts/eval.py`.
"""
