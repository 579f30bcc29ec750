"""The recipe's options: its arms, each a label and overrides of one config, the `Recipe` that runs them, and
what that config says of each arm's run.

An arm is data: the keys it overrides and their values, never parsed back. Whatever the recipe needs to know of
a run (its position mode, blend, batch, window, optimizer) it reads from the config OLMo-core builds for the arm,
exactly the config `scripts/core_train.py` trains (`run_config`).
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..stages import digest

__all__ = [
    "ARMS",
    "CONFIG",
    "KNOWN_ARMS",
    "LEARNING",
    "PAPER",
    "ROOT",
    "ROPE",
    "STUDY_ARMS",
    "Arm",
    "Recipe",
    "RunConfig",
    "run_config",
]

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "olmocore" / "smollm2-repo.py"
"""The runs' config. It and the commands (`scripts/`) are read from the source tree: the recipe runs from a
checkout (unlike `make demo`, whose package holds everything it reads), and says so in one line elsewhere."""

_MIXER = "model.block.sequence_mixer."  # the attention's keys (pe_*)


@dataclass(frozen=True)
class Arm:
    """One training run of the recipe: the report's label, its folder's name and its overrides of the config
    ((key, value) pairs, in order); every arm starts from the same checkpoint and trains on the same batches."""

    label: str
    name: str
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def args(self) -> tuple[str, ...]:
        """The overrides as `scripts/core_train.py` takes them (`--key=value`)."""
        return tuple(f"--{key}={value}" for key, value in self.overrides)


PAPER = Arm("RePo", "repo")
"""The paper's arm: f_phi fresh at the paper's learning rate."""
LEARNING = Arm(
    "RePo, learning",
    "repo-learn",
    ((f"{_MIXER}pe_blend_init", "1.0"), (f"{_MIXER}pe_blend_steps", "50"), ("f_phi.lr_multiplier", "240")),
)
"""RePo set up to learn its positions in 100 steps: the layers start as the RoPE layers they replace (p = 1)
and hand over to f_phi by step 50, whose learning rate is 240 times the schedule's: Adam moves a weight by about
lr a step, so 100 steps at 240 x 7.4e-5 (linear to 0) give each of f_phi's weights the travel the paper's 23,852
steps give it (~0.89, 44 times its init's spread). docs/research.md measures it against the others."""
ROPE = Arm("RoPE", "rope", ((f"{_MIXER}pe_mode", "rope"),))
"""The control: the stock model's RoPE in every layer."""
ARMS = (PAPER, LEARNING, ROPE)
"""The recipe's arms by default."""
STUDY_ARMS = (
    PAPER,
    LEARNING,
    ROPE,
    Arm("NoPE", "nope", ((f"{_MIXER}pe_mode", "nope"),)),
    Arm("RePo, f_phi lr x240", "repo-lr240", (("f_phi.lr_multiplier", "240"),)),
    Arm("RePo, f_phi only x240", "repo-only", (("f_phi.only", "true"), ("f_phi.lr_multiplier", "240"))),
    Arm("RePo, blend", "repo-blend", LEARNING.overrides[:2]),
    Arm("RePo, f_phi lr x30", "repo-lr30", (("f_phi.lr_multiplier", "30"),)),
)
"""docs/research.md's arms, in the order they run (the comparisons that matter most first, so that a study
stopped early has them): the paper's; the recipe's learning arm (the blend with x240); the controls, RoPE and
NoPE in RePo's layers; f_phi's learning rate x240 alone (all of the paper's travel per weight); f_phi alone at
x240; the blend at the paper's lr; f_phi's learning rate x30 (an eighth of the travel)."""
KNOWN_ARMS = {arm.name: arm for arm in STUDY_ARMS}


@dataclass(frozen=True)
class Recipe:
    """What the recipe runs: its options, and everything its stages' inputs digest."""

    steps: int = 100
    heldout_topics: int = 8
    lengths: tuple[int, ...] = (1024, 2048, 4096)
    variants: tuple[str, ...] = ("niah_single_1",)
    samples: int = 10
    procs: int = 2
    model: str | None = None  # an existing SmolLM2 directory of scripts/smollm2.py (None: made in the folder)
    arms: tuple[Arm, ...] = ARMS

    def digest(self, *fields: str) -> str:
        """A digest of the options `fields` and the config: what a stage that reads them records."""
        values = asdict(self)
        return digest(json.dumps({f: values[f] for f in fields}), CONFIG.read_bytes())


@dataclass(frozen=True)
class RunConfig:
    """What the config says of one arm's run."""

    mode: str  # the position mode of layers pe_start_layer.. (the others are RoPE)
    pe_start_layer: int
    n_layers: int
    blend_init: float  # p of the index blend at step 0, falling to 0 by step `blend_steps`
    blend_steps: int
    window: int  # tokens per training window
    windows: int  # windows per step
    lr: float  # the schedule's peak
    schedule: str
    betas: tuple[float, float]
    weight_decay: float

    @property
    def blended(self) -> bool:
        """Whether its RePo layers start blended with the token index (then step 0 is not RePo's insertion)."""
        return self.blend_init > 0 and self.blend_steps > 0

    @property
    def layers(self) -> str:
        """The layers whose positions the arm's mode sets, as the report names them: "9..29"."""
        return f"{self.pe_start_layer}..{self.n_layers - 1}"


@functools.cache
def run_config(arm: Arm = PAPER) -> RunConfig:
    """What `CONFIG` with `arm`'s overrides says of its run (OLMo-core's config, built as `core_train.py` builds
    it; needs the OLMo-core environment)."""
    from olmo_core.optim.scheduler import LinearWithWarmup

    from ...olmocore.train import build, load_build_config

    # the paths only place the run: nothing here reads them
    opts = argparse.Namespace(config=str(CONFIG), save_folder="run", data_root="data", work_dir="run", name=None,
                              sequence_length=None, dry_run=False)  # fmt: skip
    config = build(load_build_config(CONFIG), opts, list(arm.args))
    mixer, optim, scheduler = (
        config.model.block.sequence_mixer,
        config.train_module.optim,
        config.train_module.scheduler,
    )
    linear = isinstance(scheduler, LinearWithWarmup) and scheduler.alpha_f == 0 and not scheduler.warmup
    return RunConfig(
        mode=mixer.pe_mode,
        pe_start_layer=mixer.pe_start_layer,
        n_layers=config.model.n_layers,
        blend_init=mixer.pe_blend_init,
        blend_steps=mixer.pe_blend_steps,
        window=config.dataset.sequence_length,
        windows=config.data_loader.global_batch_size // config.dataset.sequence_length,
        lr=optim.lr,
        schedule="linear to 0" if linear else type(scheduler).__name__,
        betas=tuple(optim.betas),
        weight_decay=optim.weight_decay,
    )
