"""Training with OLMo-core's own `TransformerTrainModule` and `Trainer`, from a config file in OLMo-core's style.

A config file (`configs/olmocore/*.py`) defines `build_config(opts, overrides) -> ExperimentConfig`, as
OLMo-core's official scripts do (`src/scripts/official/...`), with OLMo-core's options (`--save-folder`,
`--data-root`, `--work-dir`, `--name`, `--sequence-length`, `--dry-run`; parsed by `olmo_repo.cli.core_train`)
and dotted overrides
(`--train_module.optim.lr=1e-4`, `--load_path=...`). `run` then does what OLMo-core's `script_utils.main` does,
with these differences:

- Checks first, before anything is written or a process group starts (`olmo_repo.olmocore.checks`): the override
  keys and the position modes of every block (one line naming the key), the local data files, the stage-1
  checkpoint (whole, its keys against the model's); then, as on the ai2-olmo side, a corrupt newest checkpoint of
  the save folder is moved aside so that the resume loads the latest intact one.
- The process group: gloo without CUDA (OLMo-core's `main` runs no process group on CPU), `cpu:gloo,cuda:nccl`
  with it, so `torchrun --nproc-per-node=2` trains on CPU with the config's FSDP as OLMo-core applies it.
- Stage-1 initialisation (`load_path`, when `save_folder` has no checkpoint) is strict
  (`olmo_repo.olmocore.stage1`): every base tensor bit-exact, exactly the RePo weights new, the optimizer state
  continued for the base.
- The index blend's p set on every RePo layer before each step and before in-loop evaluation, and
  `train/positions/layer{i}/{stat}` for every RePo layer (`callbacks.PositionsCallback`), as the ai2-olmo side
  logs.
- The run's `f_phi` section (`RepoExperimentConfig`): f_phi's own optimizer group (an `OptimGroupOverride` beside
  the config's), or every other weight frozen; checked before the run starts, and kept across a resume.
- `save_folder/metrics.jsonl`: every logged step once (a resumed run drops what it logs again); for a remote save
  folder, under the working directory (`callbacks.MetricsFileCallback`).
- SIGUSR1 stops the run after the current step with a checkpoint; under SLURM rank 0 then requeues the job
  (`scripts/slurm/train-core-*.sbatch`). OLMo-core itself stops the same way on SIGTERM and SIGINT.

A run resumes from the latest checkpoint in `save_folder` (OLMo-core's `maybe_load_checkpoint`) when rerun with
the same command.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureDatasetConfig, SourceMixtureList
from olmo_core.distributed.utils import get_rank
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.optim import OptimGroupOverride
from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import LoadStrategy, Trainer, prepare_training_environment, teardown_training_environment
from olmo_core.train.callbacks import ConfigSaverCallback
from olmo_core.utils import seed_all

from ..data import folder as datafolder
from ..errors import RepoError, not_a_key
from ..modes import F_PHI_WEIGHTS, FPhiTraining, is_f_phi_param
from ..ownership import die_with_launcher, held
from ..paths import is_url
from ..slurm import requeue
from .attention import repo_attention
from .callbacks import MetricsFileCallback, PositionsCallback, SignalStopCallback
from .checkpoint import fetch_file, latest_intact_checkpoint
from .checks import check_experiment, f_phi_training
from .hf import HF_CONFIG, recorded_stock
from .niah import NiahCallbackConfig
from .stage1 import load_stage1

__all__ = [
    "RepoExperimentConfig",
    "build",
    "build_trainer",
    "load_build_config",
    "on_data_root",
    "on_tokenized_text",
    "run",
    "start",
    "work_dir",
]

log = logging.getLogger(__name__)

BuildConfig = Callable[[argparse.Namespace, list[str]], ExperimentConfig]


@dataclass
class RepoExperimentConfig(ExperimentConfig):
    """OLMo-core's `ExperimentConfig` with this project's run section `f_phi` (`modes.FPhiTraining`: f_phi's own
    learning-rate multiplier and weight decay, or f_phi alone), which OLMo-core's has no slot for. The configs of
    configs/olmocore/ build it; it is recorded in every checkpoint's config.json like the rest, and
    `--f_phi.lr_multiplier=10` overrides it as any key."""

    f_phi: FPhiTraining = field(default_factory=FPhiTraining)
    """How f_phi is optimised (`olmo_repo.modes.FPhiTraining`); the defaults are the paper's."""


def _f_phi_override(config: ExperimentConfig) -> OptimGroupOverride | None:
    """f_phi's optimizer group: lr = the optimizer's lr x `f_phi.lr_multiplier` (its `initial_lr`, which the
    scheduler scales as every group's: warm-up and decay keep their shape; OLMo-core's `fixed_fields` reset it
    from the config on a resume), weight decay `f_phi.weight_decay` where set. None for the paper's settings
    or a model without RePo layers (f_phi then in the default group, as before)."""
    f_phi = f_phi_training(config)
    if repo_attention(config.model) is None or (f_phi.lr_multiplier == 1 and f_phi.weight_decay is None):
        return None
    opts: dict[str, Any] = {"lr": config.train_module.optim.lr * f_phi.lr_multiplier}
    if f_phi.weight_decay is not None:
        opts["weight_decay"] = f_phi.weight_decay
    return OptimGroupOverride(params=[f"*.{name}.weight" for name in F_PHI_WEIGHTS], opts=opts)


def load_build_config(path: str | Path) -> BuildConfig:
    """The `build_config` of a config file; `RepoError` naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RepoError(f"{path}: no such config file (see configs/olmocore/)")
    spec = importlib.util.spec_from_file_location(f"olmo_repo_config_{path.stem.replace('-', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(build := getattr(module, "build_config", None)):
        raise RepoError(f"{path} defines no build_config(opts, overrides) -> ExperimentConfig")
    return build


def on_tokenized_text(config: ExperimentConfig, hf: Any, data_root: str) -> ExperimentConfig:
    """`config` (a recipe) reading the data of `data_root` (`on_data_root`) for the model of the HF config `hf`:
    the dataset's and the in-loop NIAH's tokenizer are that model's (its vocabulary; its end id, the first where it
    lists several; its padding id, or the end id where it has none; its start id where it differs from the end
    id), what the data-tokenizer check compares with the checkpoint's. Changed in place."""
    eos = hf.eos_token_id[0] if isinstance(hf.eos_token_id, list) else hf.eos_token_id
    config.dataset.tokenizer = TokenizerConfig(
        vocab_size=hf.vocab_size,
        eos_token_id=eos,
        pad_token_id=eos if hf.pad_token_id is None else hf.pad_token_id,
        bos_token_id=None if hf.bos_token_id == eos else hf.bos_token_id,
        identifier=f"{data_root}/tokenizer.json",
    )
    return on_data_root(config, data_root)


def on_data_root(config: ExperimentConfig, data_root: str, default: str = "train.npy") -> ExperimentConfig:
    """`config` (and its in-loop NIAH) reading `data_root`, a local folder of one of the project's commands: a mix
    folder of `scripts/prepare_data.py --mix` (OLMo-core's source mixture of its `mix.json`: each source's shards, share
    and repetition, the mix's tokens, the loader's batch and seed), a data folder of `scripts/prepare_data.py`
    (the shards its `data.json` lists), else its file `default` (`scripts/tokenize_text.py`'s `train.npy`; the
    demo's `stage2.npy`); uint32 ids, and the tokenizer.json recorded there as the dataset tokenizer's
    identifier. Changed in place."""
    root = data_root.rstrip("/")
    dataset = config.dataset
    tokenizer = dataset.tokenizer
    if (mix := datafolder.mix(root, fetch_file)) is not None:
        sources = [
            SourceMixtureConfig(
                source_name=s["source_name"],
                target_ratio=s["target_ratio"],
                paths=[f"{root}/{p}" for p in s["paths"]],
                max_repetition_ratio=s["max_repetition_ratio"],
            )
            for s in mix["sources"]
        ]
        requested = mix["tokens"] or sum(s["tokens"] * s["ai2_olmo_repeat"] for s in mix["sources"])
        config.dataset = NumpyFSLDatasetConfig.from_src_mix(
            SourceMixtureDatasetConfig(
                source_list=SourceMixtureList(sources=sources),
                requested_tokens=requested,
                global_batch_size=config.data_loader.global_batch_size,
                seed=config.data_loader.seed,
                render_tables=False,
            ),
            sequence_length=dataset.sequence_length,
            tokenizer=tokenizer,
            dtype=NumpyDatasetDType.uint32,
            work_dir=dataset.work_dir,
        )
        tokenizer.identifier = _local_copy(f"{root}/{mix['tokenizer']}")
    elif datafolder.is_data_folder(root, fetch_file):  # manifest() says when it is unfinished
        data = datafolder.manifest(root, fetch_file)
        dataset.paths = datafolder.data_paths(root, data)
        tokenizer.identifier = _local_copy(f"{root}/{data['tokenizer']}")
    else:
        dataset.paths = [f"{root}/{default}"]
    config.dataset.dtype = NumpyDatasetDType.uint32  # both commands'
    for callback in config.trainer.callbacks.values():  # in-loop NIAH's prompts: the data's tokenizer
        if isinstance(callback, NiahCallbackConfig):
            callback.tokenizer = tokenizer
    return config


def _local_copy(path: str) -> str:
    """A tokenizer file a data root records, as a local path: a URL's copy (what the checks before step 0 compare
    and in-loop NIAH reads)."""
    return str(fetch_file(path) or path) if is_url(path) else path


def _backend() -> str:
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def build_trainer(config: ExperimentConfig) -> Trainer:
    """Model, train module, data loader and trainer of `config`, in an initialised process group (as
    OLMo-core's `script_utils.main` builds them), with `MetricsFileCallback`, `PositionsCallback` (the index
    blend's schedule of the model's RePo attention), the `f_phi` section applied (its optimizer group, or every
    other weight frozen) and the config for the savers."""
    seed_all(config.init_seed)
    model = config.model.build(init_device="meta")
    if f_phi_training(config).only:  # before FSDP and the optimizer: they take the frozen weights as such
        for name, param in model.named_parameters():
            param.requires_grad_(is_f_phi_param(name))
    module_config = config.train_module
    if (f_phi := _f_phi_override(config)) is not None:
        optim = module_config.optim
        optim = dataclasses.replace(optim, group_overrides=[*(optim.group_overrides or []), f_phi])
        module_config = dataclasses.replace(module_config, optim=optim)
    train_module = module_config.build(model)
    dataset = config.dataset.build()
    data_loader = config.data_loader.build(dataset, dp_process_group=train_module.dp_process_group)
    trainer_config = config.trainer
    att = repo_attention(config.model)
    blend = dict(blend_init=att.pe_blend_init, blend_steps=att.pe_blend_steps) if att is not None else {}
    added = (
        ("metrics_file", MetricsFileCallback()),
        ("signal_stop", SignalStopCallback()),
        ("positions", PositionsCallback(**blend)),
    )
    for name, callback in added:
        if name not in trainer_config.callbacks:
            trainer_config = trainer_config.with_callback(name, callback)
    trainer = trainer_config.build(train_module, data_loader)
    saved = config.as_config_dict()
    if (stock := _stock_config(config)) is not None:
        saved[HF_CONFIG] = stock  # what the conversion back to HF keeps of the stock model (olmocore.hf)
    for callback in trainer.callbacks.values():
        if isinstance(callback, ConfigSaverCallback):
            callback.config = saved
    return trainer


def _stock_config(config: ExperimentConfig) -> dict[str, Any] | None:
    """The config of the stock HF model the run continues (`olmocore.hf.HF_CONFIG`), as the save folder's latest
    checkpoint carries it (a resume; a remote save folder's checkpoints carry what its `load_path` records), else
    as `load_path` records it, local or remote; None for a model trained from scratch."""
    save = str(config.trainer.save_folder)
    latest = (
        latest_intact_checkpoint(save, move_aside=False) if not is_url(save) and Path(save).is_dir() else None
    )
    for path in (latest, config.load_path):
        if path and (stock := recorded_stock(path)) is not None:
            return stock
    return None


def start(trainer: Trainer, config: ExperimentConfig, load_optim_state: bool = True) -> bool:
    """Resume from the latest checkpoint in the save folder, else initialise from `config.load_path`. Returns
    False for a run that already reached its end (left alone: OLMo-core would save its last step again)."""
    if trainer.maybe_load_checkpoint():
        if trainer.max_steps is not None and trainer.global_step >= trainer.max_steps:
            log.info(f"Nothing to do: the run already reached step {trainer.global_step}")
            return False
    elif config.load_path:
        log.info(f"Initialising from {config.load_path} (strict: base bit-exact, RePo weights new)")
        # f_phi alone: the frozen base has no optimizer state to continue, and f_phi's starts fresh
        optim = load_optim_state and not f_phi_training(config).only
        load_stage1(trainer, config.load_path, load_optim_state=optim)
        # Loaded: `fit` would look for a checkpoint again and log that it trains "from scratch".
        trainer.load_strategy = LoadStrategy.never
    return True


def run(config: ExperimentConfig, opts: argparse.Namespace, load_optim_state: bool = True) -> None:
    """Check `config` (`check_experiment`), then train it on this rank of a new process group."""
    die_with_launcher()
    check_experiment(config)
    if opts.dry_run:
        print(config)
        return
    rank = int(os.environ.get("RANK", "0"))
    with held(str(config.trainer.save_folder), "--save-folder", rank):  # the run's folder, while it lives
        prepare_training_environment(shared_filesystem=not is_url(opts.save_folder), backend=_backend())
        try:
            trainer = build_trainer(config)
            if not start(trainer, config, load_optim_state):
                return
            trainer.fit()
            stop = trainer.callbacks["signal_stop"]
            unfinished = trainer.max_steps is None or trainer.global_step < trainer.max_steps
            if isinstance(stop, SignalStopCallback) and stop.stopped and unfinished and get_rank() == 0:
                requeue()
        finally:
            teardown_training_environment()


def work_dir(save_folder: str) -> str:
    """OLMo-core's default working directory: the save folder, or a local cache for a remote one."""
    return "/tmp/olmo-core/dataset-cache" if is_url(save_folder) else save_folder


def build(build_config: BuildConfig, opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    """`build_config(opts, overrides)`; a bad override is one `RepoError` naming the config file, an unknown key
    with its nearest known name (as the ai2-olmo side's configs)."""
    try:
        config = build_config(opts, [])
        for override in overrides:
            check_override_key(config, override.lstrip("-").split("=", 1)[0])
        return build_config(opts, overrides)
    except (OLMoConfigurationError, ValueError, KeyError) as e:
        raise RepoError(f"{opts.config}: {e}") from None


def check_override_key(config: Any, key: str) -> None:
    """`RepoError` when the dotted `key` names nothing in `config` (an OLMo-core config dataclass), walking its
    fields and dicts (callbacks: a new entry needs its class, which an override cannot give) down to a value or
    an unset field."""
    node = config
    for depth, name in enumerate(parts := key.split(".")):
        if isinstance(node, dict):
            known, owner = [str(k) for k in node], ".".join(parts[:depth])
        elif dataclasses.is_dataclass(node):
            known, owner = [f.name for f in dataclasses.fields(node)], type(node).__name__
        else:
            return
        if name not in known:
            raise RepoError(not_a_key(".".join(parts[: depth + 1]), known, owner))
        node = node[name] if isinstance(node, dict) else getattr(node, name)
