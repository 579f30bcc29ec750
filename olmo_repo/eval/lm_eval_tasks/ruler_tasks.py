"""The `repo_ruler_*` tasks' functions (lm-eval loads `!function` targets from files beside the yaml): RULER's
other tasks from `olmo_repo.eval.ruler`, bounded by `num_samples` and checked against their shortest length."""

from __future__ import annotations

from functools import partial

from olmo_repo.eval.ruler import dataset, process_results

vt = partial(dataset, "repo_ruler_vt")
cwe = partial(dataset, "repo_ruler_cwe")
fwe = partial(dataset, "repo_ruler_fwe")
qa_squad = partial(dataset, "repo_ruler_qa_squad")
qa_hotpot = partial(dataset, "repo_ruler_qa_hotpot")

__all__ = ["cwe", "fwe", "process_results", "qa_hotpot", "qa_squad", "vt"]
