"""The tiny OLMo-core run of the tests: `configs/olmocore/tiny-stage2-repo.py` on a small slice of the demo's
corpus, from the demo's base model converted to OLMo-core."""

from __future__ import annotations

import argparse
from pathlib import Path

from olmo_core.script_utils import ExperimentConfig

from olmo_repo.olmocore.train import load_build_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "olmocore" / "tiny-stage2-repo.py"
CORPUS = {"stage2": 64, "val": 8}  # windows of 512 tokens: 8 steps of 8


def build_corpus(out: Path) -> Path:
    """The demo's corpus (its generator, fewer windows: a prefix of the demo's) with the base model's tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from olmo_repo.experiments.demo import BASE_DIR
    from olmo_repo.experiments.demo.corpus import build_corpus as build

    build(out, PreTrainedTokenizerFast.from_pretrained(BASE_DIR), CORPUS)
    return out


def random_corpus(out: Path) -> Path:
    """`stage2.npy` of uniformly random token ids (as many windows as CORPUS's) and the base model's tokenizer:
    data for runs that need no NIAH documents, without building the demo's corpus."""
    import shutil

    import numpy as np

    from olmo_repo.experiments.demo import BASE_DIR

    out.mkdir(parents=True)
    ids = np.random.default_rng(0).integers(2, 4096, size=CORPUS["stage2"] * 512, dtype=np.uint32)
    ids.tofile(out / "stage2.npy")
    shutil.copyfile(BASE_DIR / "tokenizer.json", out / "tokenizer.json")
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


def metrics(save_folder: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl as {step: {name: value}} (records of one step merged)."""
    import json

    out: dict[int, dict[str, float]] = {}
    for line in (save_folder / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record.pop("step"), {}).update(record)
    return out


def stage1_checkpoint(out: Path, data: Path, base: Path) -> Path:
    """A stage-1 OLMo-core checkpoint with AdamW state: the base model as a RoPE run after one step (one gloo
    process), saved as OLMo-core's Trainer saves (flattened optimizer state)."""
    import olmo_core.distributed.parallel as parallel
    import torch
    from olmo_core.distributed.checkpoint import save_model_and_optim_state
    from olmo_core.distributed.utils import init_distributed

    from olmo_repo.olmocore.attention import with_position_modes
    from olmo_repo.olmocore.train import build_trainer, start

    own_group = not torch.distributed.is_initialized()
    init_distributed(backend="gloo")
    config = tiny_experiment(out.with_name(out.name + "-run"), data, f"--load_path={base}")
    config.model = with_position_modes(config.model, "rope")
    parallel._WORLD_MESH = None  # OLMo-core builds one device mesh per process; tests build several
    trainer = build_trainer(config)
    start(trainer, config)
    trainer.train_module.train_batch({"input_ids": torch.randint(2, 4096, (2, 512))})
    trainer.train_module.optim_step()
    module = trainer.train_module
    save_model_and_optim_state(
        out / "model_and_optim", module.model, module.optim, flatten_optimizer_state=True
    )
    if own_group:  # OLMo-core reads checkpoints key by key only outside a process group (`load_keys`)
        torch.distributed.destroy_process_group()
    return out
