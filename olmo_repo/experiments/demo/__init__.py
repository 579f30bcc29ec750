"""`make demo` and `make demo-base`, with their package data: the tiny configs (`configs/tiny-*.yaml`) and the
shipped tiny base model (`base_model/`, HF bf16). Nothing here reads the source tree, so the demo runs from
a plain (non-editable) install.

Modules, each depending only on those before it:

    corpus     the offline tokenizer and corpus (RULER NIAH documents, retrieval practice, stories)
    training   one training run in a subprocess (`python -m olmo_repo.cli.train`), summarised from metrics.jsonl
    base       make demo-base: rebuild the shipped base model; its tokenizer
    report     report.md's training table and in-loop NIAH section, from the runs' records
    demo       make demo: its stages (on `olmo_repo.experiments.stages`) and report.md assembled from their records

This module is light (pathlib only): importing a submodule does not load torch through it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BASE_DIR", "CONFIGS_DIR", "PROCS", "SAMPLES", "SPECIALS", "STAGE2", "TRAINING", "config_path"]

BASE_DIR = Path(__file__).resolve().parent / "base_model"
"""The shipped tiny base model that `make demo` starts from (HF, bf16, with its tokenizer)."""

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
"""The demo's training configs, `tiny-{base-rope,stage1-rope,stage2-rope,stage2-repo,stage2-repo-learn,stage2-nope}.yaml`."""


PROCS = 2
"""Training processes per run of `make demo`, one thread each: on 2 cores this layout keeps its speed when other
work shares them, where one process with two threads slows down (`bench/bench_demo_layout.py` measures the
layouts; README, "make demo")."""

SAMPLES = 10
"""NIAH prompts per variant of `make demo`: in-loop (the configs' `prompts`) and per length in its evaluation."""

SPECIALS = ("<|endoftext|>", "<|pad|>")
"""The special tokens of the demo's BPE (ids 0 and 1: the configs' eos_token_id and pad_token_id)."""


STAGE2 = {
    "RoPE": "stage2-rope",
    "RePo": "stage2-repo",
    "RePo, learning": "stage2-repo-learn",
    "NoPE": "stage2-nope",
}
"""The stage-2 runs, by the name the report gives their models: the paper's three rows, and RePo set up to learn
its positions in 200 steps (the index blend's warm start and f_phi's own learning rate); each is its config."""

TRAINING = ["stage1-rope", *STAGE2.values()]
"""The demo's training runs, in the order they run: stage 1, then every stage-2 run from its checkpoint."""


def config_path(name: str) -> Path:
    """The shipped config `tiny-{name}.yaml` (name: base-rope, stage1-rope or one of `STAGE2`'s)."""
    return CONFIGS_DIR / f"tiny-{name}.yaml"
