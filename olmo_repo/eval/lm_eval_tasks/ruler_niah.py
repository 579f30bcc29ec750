"""The `repo_niah_*` tasks' functions (lm-eval loads `!function` targets from files beside the yaml):
RULER documents from `olmo_repo.eval.niah` (offline), scored with RULER's string-match-all."""

from __future__ import annotations

from functools import partial

from olmo_repo.eval.niah import lm_eval_dataset, score

niah_single_1 = partial(lm_eval_dataset, "niah_single_1")
niah_single_2 = partial(lm_eval_dataset, "niah_single_2")
niah_single_3 = partial(lm_eval_dataset, "niah_single_3")
niah_multikey_1 = partial(lm_eval_dataset, "niah_multikey_1")
niah_multikey_2 = partial(lm_eval_dataset, "niah_multikey_2")
niah_multikey_3 = partial(lm_eval_dataset, "niah_multikey_3")
niah_multivalue = partial(lm_eval_dataset, "niah_multivalue")
niah_multiquery = partial(lm_eval_dataset, "niah_multiquery")


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"score": score(results[0], doc["outputs"])}
