"""The paper's evaluation suite as lm-eval task groups (shipped in `lm_eval_tasks/`), run on one model.

Groups (their task lists are the yaml files; `group_tasks(name)` reads them):

- `repo_niah`: the eight RULER NIAH variants (noisy context), offline.
- `repo_hybridqa`: HybridQA (structured data), exact match; this project's task (lm-eval has none).
- `repo_olmes`: the general short-context tasks (the OLMES core set), lm-eval's versions.
- `repo_ruler`: RULER (NIAH offline; variable tracking, common and frequent words offline; two QA tasks), the
  non-NIAH tasks through `olmo_repo.eval.ruler` (lm-eval's generators, bounded by the sample count).
- `repo_longbench`: LongBench-E, English QA, few-shot and summarization tasks.

`plan(lengths)`: every group at the first length (the training length, 4096 for the paper), RULER and LongBench
at the others (8K and 16K with YaRN in the paper). `DOWNLOADS` says what each task downloads; without a
network (or with `HF_HUB_OFFLINE` / `HF_DATASETS_OFFLINE` set) a task whose data set is not in the Hugging
Face cache is refused, and `refusal(...)` says in one line what needs downloading. `run_stage` runs one
length's tasks with lm-eval's HF backend on a loaded model.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from huggingface_hub import constants
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..upstream.lm_eval import load_yaml, without_environment_report
from . import ruler
from .niah import ESSAYS, TASKS_DIR, VARIANTS, niah_samples
from .variants import RULER_SEED

__all__ = [
    "DOWNLOADS",
    "GROUPS",
    "available",
    "check_lengths",
    "group_tasks",
    "main_metric",
    "network",
    "plan",
    "refusal",
    "run_stage",
]

GROUPS = ("repo_niah", "repo_hybridqa", "repo_olmes", "repo_ruler", "repo_longbench")
LONG_GROUPS = ("repo_ruler", "repo_longbench")

_LONGBENCH = "Xnhyacinth/LongBench"
# What each task downloads: a Hub data set ("org/name"), another source (words), or None (offline).
DOWNLOADS: dict[str, str | None] = {
    **{f"repo_{v}": None for v in VARIANTS},
    **{task: spec.download for task, spec in ruler.TASKS.items()},
    **{
        f"longbench_{name}_e": _LONGBENCH
        for name in (
            "qasper",
            "multifieldqa_en",
            "hotpotqa",
            "2wikimqa",
            "gov_report",
            "multi_news",
            "trec",
            "triviaqa",
            "samsum",
        )  # fmt: skip
    },
    "arc_challenge": "allenai/ai2_arc",
    "arc_easy": "allenai/ai2_arc",
    "boolq": "aps/super_glue",
    "commonsense_qa": "tau/commonsense_qa",
    "hellaswag": "Rowan/hellaswag",
    "mmlu": "cais/mmlu",
    "openbookqa": "allenai/openbookqa",
    "piqa": "baber/piqa",
    "social_iqa": "lighteval/siqa",
    "winogrande": "allenai/winogrande",
    "repo_hybridqa": "wenhu/hybrid_qa",
}
# Preferred metric of a task's lm-eval results, first match wins (RULER's own tasks report the length).
_METRICS = ("score", "{length}", "acc_norm", "acc", "exact_match", "f1")


def group_tasks(group: str) -> list[str]:
    """The tasks of one of `GROUPS` (a task file is a group of itself)."""
    config = load_yaml(TASKS_DIR / f"{group}.yaml", resolve_func=False)
    return list(config["task"]) if "group" in config else [config["task"]]


def plan(lengths: list[int]) -> list[tuple[int, list[str]]]:
    """[(length, tasks)]: every group at the first length, the long-context groups at the others."""
    stages = []
    for i, length in enumerate(lengths):
        tasks = [task for group in (GROUPS if i == 0 else LONG_GROUPS) for task in group_tasks(group)]
        stages.append((length, list(dict.fromkeys(tasks))))
    return stages


def check_lengths(
    tokenizer: PreTrainedTokenizerBase,
    stages: list[tuple[int, list[str]]],
    seed: int = RULER_SEED,
    essays: str = ESSAYS[0],
) -> None:
    """Before anything runs: every task of every stage can build its prompts at its length with `tokenizer`.
    ValueError, in one line naming the task and the shortest length it can build, for the first that cannot.
    (Tasks without a generator of their own, lm-eval's OLMES and LongBench, truncate to the length.)"""
    for length, tasks in stages:
        for task in tasks:
            if task.removeprefix("repo_") in VARIANTS:
                niah_samples(tokenizer, task.removeprefix("repo_"), length, 1, seed, essays)
            elif task in ruler.TASKS:
                ruler.check_length(task, tokenizer, length, seed)


def network(timeout: float = 3.0) -> bool:
    """Whether data sets can be downloaded: not told offline, and the Hub answers."""
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE", "0").upper() in (
        "1",
        "ON",
        "YES",
        "TRUE",
    ):
        return False
    try:
        socket.create_connection(
            (constants.ENDPOINT.split("://")[-1].split("/")[0], 443), timeout=timeout
        ).close()
    except OSError:
        return False
    return True


def _cached(dataset: str) -> bool:
    return (Path(constants.HF_HUB_CACHE) / f"datasets--{dataset.replace('/', '--')}").is_dir()


def available(task: str, online: bool) -> bool:
    """Whether `task` can run: offline, or online, or its Hub data set is in the local cache."""
    need = DOWNLOADS[task]
    return need is None or online or ("/" in need and " " not in need and _cached(need))


def refusal(refused: list[str]) -> str:
    """One line naming what the refused tasks need downloading."""
    needs: dict[str, list[str]] = {}
    for task in refused:
        needs.setdefault(DOWNLOADS[task] or "", []).append(task)
    parts = "; ".join(f"{need} ({', '.join(tasks)})" for need, tasks in needs.items())
    return (
        f"not run without a network: {len(refused)} tasks need downloading: {parts}. "
        "Run with a network, or fill the Hugging Face cache first."
    )


def main_metric(task_results: dict[str, Any], length: int) -> float | None:
    """The task's headline number from lm-eval's results dict (None if it reports none of `_METRICS`)."""
    for name in _METRICS:
        value = task_results.get(f"{name.format(length=length)},none")
        if isinstance(value, int | float) and value != -1:
            return float(value)
    return None


def run_stage(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    tasks: list[str],
    *,
    samples: int | None = None,
    seed: int = RULER_SEED,
    batch_size: int = 8,
    essays: str = "offline",
) -> dict[str, dict[str, Any]]:
    """Run `tasks` at `length` on a loaded model with lm-eval's HF backend (`max_length=length`).

    RULER tasks size their prompts to `length` with the model's tokenizer; `samples` is the NIAH sample count
    (default `RULER_SAMPLES`) and lm-eval's `limit` for the other tasks. Returns lm-eval's per-task results.
    """
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    metadata = dict(max_seq_lengths=[length], seed=seed, essays=essays, tokenizer=tokenizer.name_or_path)
    if samples is not None:
        metadata["num_samples"] = samples
    manager = TaskManager(include_path=str(TASKS_DIR), metadata=metadata)
    if isinstance(model, LM):  # already an lm-eval model (--backend vllm)
        lm = model
    else:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=length)
    with without_environment_report():
        out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=samples)
    return {task: out["results"][task] for task in tasks if task in out["results"]}
