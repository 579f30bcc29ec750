"""The tiny base model `make demo` starts from, shipped in the package as `olmo_repo/experiments/demo/base_model/` (HF
format, bf16, with its tokenizer): the analogue of the pre-trained OLMo-2 checkpoint the official recipe starts
from.

Why ship it: retrieval (NIAH) needs induction heads, and a tiny model from scratch does not form them within
a CPU demo's minutes (docs/demo.md). `make demo-base` rebuilds it: the demo's tokenizer, the "base"
split of the demo corpus (`olmo_repo.experiments.demo.corpus`), `tiny-base-rope.yaml` through `olmo_repo.cli.train`, and
the conversion to HF in bf16, with the same seeds and data as the shipped one (README, "make demo", says how long
it takes). Float rounding differs between CPUs, so a rebuild elsewhere is close to the shipped weights, not equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from ...errors import CorruptFileError, RepoError
from . import BASE_DIR, SPECIALS, config_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["BASE_STEPS", "HF_FILES", "base_tokenizer", "build_base"]

BASE_STEPS: int = OmegaConf.load(config_path("base-rope")).max_duration
# What convert_to_hf writes for the base: an existing output folder holding anything else is not ours.
HF_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def base_tokenizer(base_dir: Path = BASE_DIR) -> PreTrainedTokenizerFast:
    """The base model's tokenizer: the demo corpus is tokenized with it."""
    from transformers import PreTrainedTokenizerFast

    path = base_dir / "tokenizer.json"
    if not path.is_file():
        raise CorruptFileError(
            f"{path} is missing: reinstall olmo-repo, or rebuild the base model with `make demo-base`"
        )
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=SPECIALS[0], pad_token=SPECIALS[1])


def build_base(work: Path, out: Path = BASE_DIR, steps: int = BASE_STEPS) -> Path:
    """Build the tokenizer and `steps` x BATCH windows of the corpus's "base" split under `work/data`, train
    `tiny-base-rope.yaml` for `steps` steps in `work/base-rope`, and write the final checkpoint as HF bf16 to
    `out` (replaced only once the conversion succeeded). Returns `out`.

    `work` is a `Stages` folder (new, empty or a previous build's); an `out` holding files that no build wrote is
    refused (`RepoError`), both before any work."""
    from ..stages import Stages

    if out.is_dir() and not {p.name for p in out.iterdir()} <= HF_FILES or out.is_file():
        raise RepoError(f"{out} holds files that no base build wrote: pass a new folder as the output")
    folder = Stages(work)
    from ...ai2olmo.hf import convert_to_hf  # heavy (torch, ai2-olmo): once the folders are accepted
    from .corpus import BATCH, SPLIT_WINDOWS, build_corpus, build_tokenizer
    from .training import latest_checkpoint, run_training, summarise

    folder.clear()
    data = folder.entry("data")
    print(f"Building the tokenizer and the base corpus under {data}...", flush=True)
    build_corpus(data, build_tokenizer(), {"base": steps * BATCH, "val": SPLIT_WINDOWS["val"]})
    folder.entry("base-rope.log")
    wall = run_training(
        "base-rope",
        config_path("base-rope"),
        folder.entry("base-rope"),
        f"--data_prefix={data}",
        f"--max_duration={steps}",
        f"--stop_at={steps}",
    )
    save = folder.path / "base-rope"
    run = summarise("base-rope", save, wall, latest_checkpoint("base-rope", save))
    convert_to_hf(run.checkpoint, out, force=True, dtype="bfloat16")
    print(
        f"Base model: {run.steps} steps, final loss {run.last_loss:.3f}, {run.wall_s:.0f} s of training -> {out}"
    )
    return out
