"""The tiny OLMo-core run of the tests: `configs/olmocore/tiny-stage2-repo.py` on a small slice of the demo's
corpus, from the demo's base model converted to OLMo-core."""

from __future__ import annotations

import argparse
from pathlib import Path

from olmo_core.script_utils import ExperimentConfig

from olmo_repo.olmocore.train import load_build_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "olmocore" / "tiny-stage2-repo.py"
CORPUS = {"stage2": 48, "val": 8}  # windows of 512 tokens: 6 steps of 8


def build_corpus(out: Path) -> Path:
    """The demo's corpus (its generator, fewer windows: a prefix of the demo's) with the base model's tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from olmo_repo.demo import BASE_DIR
    from olmo_repo.demo.corpus import build_corpus as build

    build(out, PreTrainedTokenizerFast.from_pretrained(BASE_DIR), CORPUS)
    return out


def tiny_options(save_folder: Path, data_root: Path) -> argparse.Namespace:
    return argparse.Namespace(
        config=str(TINY),
        name="test",
        sequence_length=None,
        data_root=str(data_root),
        save_folder=str(save_folder),
        work_dir=str(save_folder),
        dry_run=False,
        train_single=False,
    )


def tiny_experiment(save_folder: Path, data_root: Path, *overrides: str) -> ExperimentConfig:
    """The tiny config with `overrides` (OLMo-core's dotted `--key=value`), NIAH off unless overridden."""
    base = ["--trainer.callbacks.niah.enabled=false", "--trainer.callbacks.checkpointer.save_interval=2"]
    return load_build_config(TINY)(tiny_options(save_folder, data_root), [*base, *overrides])
