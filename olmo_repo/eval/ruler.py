"""RULER's other tasks for the suite: variable tracking (vt), common and frequent words (cwe, fwe), offline,
and the two QA tasks (SQuAD, HotpotQA: downloaded). Writing a sample is lm-eval's RULER code
(`lm_eval.tasks.ruler.*_utils`, through `olmo_repo.upstream.lm_eval`); the tasks `repo_ruler_*` differ from
lm-eval's `ruler_*` in what the suite needs:

- Bounded: `num_samples` samples per length (the suite's `--samples`; default `RULER_SAMPLES`). lm-eval's
  tasks always build `RULER_SAMPLES`, whatever `limit` says.
- Checked: `check_length(task, tokenizer, length)` refuses, in one line naming the task and the shortest
  length it can build, a length below `min_length(...)`. Below it lm-eval's vt and cwe searches shrink
  their haystack to nothing and then retry forever (vt printing "reduces chain length for not enough
  noises" each time); the check runs for every task and length before any weights load.
- Seeded: each (task, length) draws from `random` and numpy seeded from (seed, task, length); the caller's
  states are restored. lm-eval's draw from the unseeded global generators.
- fwe's prompt is sized to `length` minus its 50 generated tokens, like every other task: lm-eval's fills
  the whole length, and its HF backend then cuts the prompt's beginning (the instruction) to make room.
- Scored with RULER's string match (all answers for vt/cwe/fwe, any for QA) as metric `score`.
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from ..upstream.lm_eval import metadata_tokenizer, ruler_module, ruler_score, ruler_score_part, seeded_random
from .variants import RULER_SAMPLES, RULER_SEED

__all__ = ["TASKS", "check_length", "dataset", "min_length", "process_results"]


@dataclass(frozen=True)
class Task:
    """One RULER task: lm-eval's module and tokens to generate; `download`: what its data needs, if any."""

    module: str
    tokens_to_generate: int
    download: str | None = None


TASKS: dict[str, Task] = {
    "repo_ruler_vt": Task("vt", 30),
    "repo_ruler_cwe": Task("cwe", 120),
    "repo_ruler_fwe": Task("fwe", 50),
    "repo_ruler_qa_squad": Task("qa", 32, "the SQuAD v2 dev set (RULER QA)"),
    "repo_ruler_qa_hotpot": Task("qa", 32, "the HotpotQA dev set (RULER QA)"),
}
# lm-eval's search steps (its defaults): the smallest haystack its vt/cwe searches keep before looping.
_VT_NOISES, _VT_ICL_NOISES, _VT_ICL_LENGTH, _CWE_WORDS = 10, 5, 500, 10
# Token counts vary between draws (random names, words and values); a length this much above the measured
# smallest prompt always fits.
_MARGIN = 1.1


@contextlib.contextmanager
def _seeded(*key: Any) -> Iterator[None]:
    """`random`, numpy's global generator and cwe's module generator (`RNG`, which shuffles its word lists)
    seeded from `key`, lm-eval's prints and progress bars silenced (vt prints a line per search step); the
    generators' states restored after."""
    rng = random.Random("ruler/" + "/".join(map(str, key)))
    cwe = ruler_module("cwe")
    numpy_state, cwe_state = np.random.get_state(), cwe.RNG.getstate()
    np.random.seed(rng.getrandbits(32))
    cwe.RNG.seed(rng.getrandbits(64))
    try:
        with (
            seeded_random(rng.getstate()),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            yield
    finally:
        np.random.set_state(numpy_state)
        cwe.RNG.setstate(cwe_state)


def _tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text).input_ids)  # as lm-eval's generators count


def _vt_icl_example(tokenizer: PreTrainedTokenizerBase, seed: int) -> dict | None:
    """lm-eval's in-context example of vt (sized to `_VT_ICL_LENGTH` tokens), or None if even its smallest does not fit
    (lm-eval's search would then loop forever)."""
    vt = ruler_module("vt")
    with _seeded(seed, "vt-icl"):
        text, answer = vt.generate_input_output(_VT_ICL_NOISES, 1, 4, is_icl=True)
        if _MARGIN * (_tokens(tokenizer, f"{text} {answer}") + 30) > _VT_ICL_LENGTH:
            return None
        return vt.sys_vartrack_w_noise_random(tokenizer, 1, _VT_ICL_LENGTH, incremental=_VT_ICL_NOISES)[0]


def min_length(
    task: str, tokenizer: PreTrainedTokenizerBase, length: int = 0, seed: int = RULER_SEED
) -> int | None:
    """The shortest length at which `task` builds its samples with `tokenizer` (None: at none). `length`
    picks cwe's variant (its prompts change at 4096)."""
    spec = TASKS[task]
    module = ruler_module(spec.module)
    if spec.module == "vt":
        icl = _vt_icl_example(tokenizer, seed)
        if icl is None:
            return None
        with _seeded(seed, "vt-min"):
            text, answer = module.generate_input_output(_VT_NOISES, 1, 4)
        example = icl["input"] + " " + " ".join(icl["outputs"]) + "\n\n"  # as lm-eval measures it
        smallest = _tokens(tokenizer, f"{text} {answer}") + _tokens(tokenizer, example)
    elif spec.module == "cwe":
        with _seeded(seed, "cwe-min"):
            example, text, answer = module.generate_input_output(_CWE_WORDS, length)
        listed = " ".join(f"{i + 1}. {word}" for i, word in enumerate(answer))
        smallest = _tokens(tokenizer, f"{example}\n{text} {listed}")
    elif spec.module == "fwe":  # an empty coded text; its vocabulary needs 4 words (length // 50)
        template = module.TEMPLATE.format(context="", query="")
        return max(4 * 50, int(_MARGIN * (_tokens(tokenizer, template) + 2 * spec.tokens_to_generate)))
    else:  # QA: the template and question alone; the documents are checked by lm-eval's (finite) search
        smallest = _tokens(tokenizer, module.TEMPLATE.format(context="", query="?"))
    return int(_MARGIN * (smallest + spec.tokens_to_generate)) + 1


def check_length(task: str, tokenizer: PreTrainedTokenizerBase, length: int, seed: int = RULER_SEED) -> None:
    """ValueError in one line naming `task` and the shortest length it can build, if `length` is shorter."""
    shortest = min_length(task, tokenizer, length, seed)
    if shortest is None:
        raise ValueError(
            f"{task}: cannot be built with this tokenizer at any length (its in-context example alone exceeds "
            f"RULER's {_VT_ICL_LENGTH} tokens)"
        )
    if length < shortest:
        raise ValueError(
            f"{task}: length {length} is too short; the shortest it can build is {shortest} tokens: pass "
            f"--lengths of at least {shortest}"
        )


def _samples(task: str, tokenizer: PreTrainedTokenizerBase, length: int, n: int, seed: int) -> list[dict]:
    spec = TASKS[task]
    check_length(task, tokenizer, length, seed)  # below it lm-eval's vt and cwe loop forever
    module = ruler_module(spec.module)
    icl = _vt_icl_example(tokenizer, seed) if spec.module == "vt" else None
    with _seeded(seed, task, length):
        if spec.module == "vt":
            return module.sys_vartrack_w_noise_random(tokenizer, n, length, icl_example=icl)
        if spec.module == "cwe":
            return module.sys_word_pair_random(n, length, tokenizer)
        if spec.module == "fwe":
            samples = module.sys_kwext(tokenizer, length - spec.tokens_to_generate, num_samples=n)
            return [{**s, "max_length": length} for s in samples]
        qas, docs = module.read_squad() if task == "repo_ruler_qa_squad" else module.read_hotpotqa()  # cached
        return module.generate_samples(tokenizer, docs, qas, length, num_samples=n)


def dataset(task: str, **metadata: Any) -> datasets.DatasetDict:
    """lm-eval `custom_dataset` of the `repo_ruler_*` tasks: `num_samples` (default `RULER_SAMPLES`) documents
    per length in `max_seq_lengths`, from the metadata lm-eval passes (`tokenizer` or `pretrained`, `seed`)."""
    tokenizer = metadata_tokenizer(metadata)
    seed = int(metadata.get("seed", RULER_SEED))
    n = int(metadata.get("num_samples", RULER_SAMPLES))
    docs = [
        doc
        for length in metadata.get("max_seq_lengths", [4096])
        for doc in _samples(task, tokenizer, int(length), n, seed)
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """RULER's score of one sample: QA counts any gold answer, the others the fraction of them found."""
    answers = [doc["outputs"]] if isinstance(doc["outputs"], str) else list(doc["outputs"])
    qa = doc.get("gen_prefix") == "Answer:"
    return {"score": (ruler_score_part if qa else ruler_score)(results[0], answers)}
