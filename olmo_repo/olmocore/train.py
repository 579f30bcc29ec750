"""Training with OLMo-core's own `TransformerTrainModule` and `Trainer`, from a config file in OLMo-core's style.

A config file (`configs/olmocore/*.py`) defines `build_config(opts, overrides) -> ExperimentConfig`, as
OLMo-core's official scripts do (`src/scripts/official/...`), with OLMo-core's options (`--save-folder`,
`--data-root`, `--work-dir`, `--name`, `--sequence-length`, `--dry-run`; parsed by `olmo_repo.cli.core_train`)
and dotted overrides
(`--train_module.optim.lr=1e-4`, `--load_path=...`). `run` then does what OLMo-core's `script_utils.main` does,
with these differences:

- Checks first, before anything is written or a process group starts: the override keys and the position modes
  of every block (one line naming the key), the local data files, the stage-1 checkpoint (whole, its keys
  against the model's); then, as on the ai2-olmo side, a corrupt newest checkpoint of the save folder is moved
  aside so that the resume loads the latest intact one.
- The process group: gloo without CUDA (OLMo-core's `main` runs no process group on CPU), `cpu:gloo,cuda:nccl`
  with it, so `torchrun --nproc-per-node=2` trains on CPU with the config's FSDP as OLMo-core applies it.
- Stage-1 initialisation (`load_path`, when `save_folder` has no checkpoint) is strict
  (`olmo_repo.olmocore.stage1`): every base tensor bit-exact, exactly the RePo weights new, the optimizer state
  continued for the base.
- The index blend's p set on every RePo layer before each step and before in-loop evaluation, and
  `train/positions/layer{i}/{stat}` for every RePo layer (`PositionsCallback`), as the ai2-olmo side logs.
- The run's `f_phi` section (`RepoExperimentConfig`): f_phi's own optimizer group (an `OptimGroupOverride` beside
  the config's), or every other weight frozen; checked before the run starts, and kept across a resume.
- `save_folder/metrics.jsonl`: every logged step once (a resumed run drops what it logs again); for a remote save
  folder, under the working directory (`MetricsFileCallback`).
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
import math
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import torch
from olmo_core.data import NumpyDatasetConfig, NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureDatasetConfig, SourceMixtureList
from olmo_core.distributed.utils import get_rank
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.optim import OptimGroupOverride
from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import LoadStrategy, Trainer, prepare_training_environment, teardown_training_environment
from olmo_core.train.callbacks import Callback, ConfigSaverCallback
from olmo_core.utils import seed_all

from ..data import folder as datafolder
from ..errors import RepoError, not_a_key, not_a_length
from ..metrics import append_metrics, trim_metrics
from ..modes import F_PHI_WEIGHTS, FPhiTraining, index_blend, is_f_phi_param
from ..ownership import LOCK_FILE, check_free, die_with_launcher, held
from ..paths import is_url
from ..positions import position_stats
from ..rope import set_index_blend
from ..slurm import requeue
from ..vocab import vocabulary_difference
from .attention import RepoAttentionConfig, repo_attention
from .checkpoint import CONFIG, fetch_file, latest_intact_checkpoint, read_config
from .hf import HF_CONFIG, recorded_stock
from .niah import NiahCallbackConfig
from .stage1 import check_stage1, load_stage1

__all__ = [
    "MetricsFileCallback",
    "PositionsCallback",
    "RepoExperimentConfig",
    "SignalStopCallback",
    "build",
    "build_trainer",
    "check_experiment",
    "load_build_config",
    "on_data_root",
    "on_tokenized_text",
    "work_dir",
    "run",
    "start",
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


def f_phi_training(config: ExperimentConfig) -> FPhiTraining:
    """The run's `f_phi` section; the paper's defaults for an `ExperimentConfig` without one."""
    return getattr(config, "f_phi", None) or FPhiTraining()


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
    """`config` (and its in-loop NIAH) reading `data_root`, a local folder of one of the project's commands: a mix folder of
    `scripts/prepare_data.py --mix` (OLMo-core's source mixture of its `mix.json`: each source's shards, share
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


def _data_paths(dataset: NumpyDatasetConfig) -> list[str]:
    """The data files a dataset reads: its paths, or every source's of its source mixture (a named mix's are
    OLMo-core's own)."""
    paths = list(getattr(dataset, "paths", None) or [])
    mixture = getattr(dataset, "source_mixture_config", None)
    if mixture is not None:
        paths = [p for source in mixture.source_list.sources for p in source.paths]
    return [] if getattr(dataset, "mix", None) is not None else [str(p) for p in paths]


_BUCKETS = ("s3", "r2", "weka", "gs")  # the object stores of olmo_core.io


def _is_run(folder: Path) -> bool:
    """Whether `folder` holds what a run writes first: its data order, metrics or a checkpoint (a rerun resumes
    it); a folder of other files is not trained over."""
    return any(
        p.name in ("metrics.jsonl", LOCK_FILE) or re.fullmatch(r"step\d+|global_indices_.*\.npy", p.name)
        for p in folder.iterdir()
    )


def _check_batch(config: ExperimentConfig, world_size: int) -> None:
    """The batch splits over the data-parallel ranks of `world_size` (OLMo-core checks it in every rank once the
    model is built, with a traceback)."""
    module = config.train_module
    degrees = [getattr(c, "degree", 1) for c in (module.tp_config, module.cp_config) if c is not None]
    dp = max(world_size // math.prod(degrees), 1)
    batch, micro, length = (
        config.data_loader.global_batch_size,
        module.rank_microbatch_size,
        module.max_sequence_length,
    )
    if micro % length:
        raise RepoError(
            f"train_module.rank_microbatch_size={micro} tokens is not a whole number of sequences of "
            f"train_module.max_sequence_length={length}: pass a multiple of {length}"
        )
    if batch % (micro * dp):
        raise RepoError(
            f"data_loader.global_batch_size={batch} tokens does not split into {dp} data-parallel rank(s) of "
            f"whole micro-batches (train_module.rank_microbatch_size={micro} tokens): pass a "
            f"--data_loader.global_batch_size that is a multiple of {micro * dp}"
        )


def check_experiment(config: ExperimentConfig, world_size: int | None = None) -> None:
    """What can be checked before a process group starts, for a run of `world_size` ranks (default: this
    process's torchrun environment); `RepoError`/`OLMoConfigurationError` naming the key or file."""
    save = str(config.trainer.save_folder)
    url = urlparse(save)
    if is_url(save) and url.scheme in _BUCKETS and "/" not in url.path.strip("/"):
        # OLMo-core clears a step's temporary folder before writing it, and refuses to clear one less than two
        # folders below a bucket's root: the first checkpoint would fail after the run started.
        raise RepoError(
            f"--save-folder={save}: OLMo-core saves into a bucket only two or more folders below its root; "
            f"use e.g. {url.scheme}://{url.netloc}/runs/{url.path.strip('/') or 'NAME'}"
        )
    folder = Path(save)
    if not is_url(save) and folder.is_dir() and any(folder.iterdir()) and not _is_run(folder):
        theirs = sorted(p.name for p in folder.iterdir())
        raise RepoError(
            f"--save-folder={save} holds {', '.join(theirs[:3])}{' ...' if len(theirs) > 3 else ''} but no run "
            "(no metrics.jsonl, stepN/ or global_indices_*.npy): use a new or empty folder"
        )
    check_free(save, "--save-folder")  # before anything below touches the folder
    lengths = {
        "train_module.max_sequence_length": config.train_module.max_sequence_length,
        "dataset.sequence_length": getattr(config.dataset, "sequence_length", 1),
    }
    for key, length in lengths.items():  # OLMo-core divides by them
        if length is not None and length < 1:
            raise RepoError(not_a_length(key, length))
    model = config.model
    for block in model.resolved_block_configs:
        if isinstance(block.sequence_mixer, RepoAttentionConfig):
            block.sequence_mixer.check(model.n_layers)
    _check_f_phi(config)
    _check_batch(config, world_size or int(os.environ.get("WORLD_SIZE", "1")))
    niah = [c for c in config.trainer.callbacks.values() if isinstance(c, NiahCallbackConfig) and c.enabled]
    for callback in niah:  # what its build would refuse once the model is up (no prompt built yet)
        callback.check(config.train_module.max_sequence_length)
    for path in _data_paths(config.dataset):
        if not is_url(path) and not Path(path).is_file():
            raise RepoError(
                f"dataset.paths: {path} does not exist (pass --data-root, or build the data first)"
            )
    if config.load_path and not is_url(config.load_path):
        check_stage1(config.load_path, model)
    _check_tokenizer(config)
    _check_data_folders(config)
    for callback in niah:  # one prompt per variant with the tokenizer checked above: a haystack too long
        callback.check_prompts_fit(config.train_module.max_sequence_length)
    if (
        not is_url(save) and folder.is_dir()
    ):  # last: the checkpoint a resume loads, a corrupt newer moved aside
        latest = latest_intact_checkpoint(folder, move_aside=os.environ.get("RANK", "0") == "0")
        if latest is not None:
            _check_resumed_f_phi(config, latest)


def _check_f_phi(config: ExperimentConfig) -> None:
    """The `f_phi` section's values (`modes.FPhiTraining.check`) and an index blend that a context-parallel
    run could not compute (a shard's tokens have no index in a RePo layer: `olmo_repo.upstream.olmo_core`);
    `OLMoConfigurationError` naming the key."""
    att = repo_attention(config.model)
    try:
        f_phi_training(config).check(has_repo=att is not None)
    except ValueError as e:
        raise OLMoConfigurationError(str(e)) from None
    if (
        att is not None
        and config.train_module.cp_config is not None
        and index_blend(att.pe_blend_init, att.pe_blend_steps, 0)
    ):
        raise OLMoConfigurationError(
            f"model.block.sequence_mixer.pe_blend_init={att.pe_blend_init} blends RePo positions with each "
            "token's index, which a context-parallel shard does not have here: unset train_module.cp_config, "
            "or set pe_blend_steps=0"
        )


def _check_resumed_f_phi(config: ExperimentConfig, checkpoint: Path) -> None:
    """A resume keeps the `f_phi` section the run was started with (its optimizer groups and frozen weights are
    in the checkpoint): `RepoError` naming both where the config's differs from the one `checkpoint` records (a
    checkpoint without one recorded the paper's)."""
    if not (checkpoint / CONFIG).is_file():
        return
    recorded = dict(read_config(checkpoint).get("f_phi") or {})
    recorded.pop("_CLASS_", None)
    if problem := f_phi_training(config).resume_problem(FPhiTraining(**recorded), str(checkpoint)):
        raise RepoError(problem)


def _check_tokenizer(config: ExperimentConfig) -> None:
    """The data is the model's tokenizer's (`olmo_repo.vocab`): the model embeds every id of the data's
    tokenizer, and a local `load_path` (the checkpoint continued, which records the tokenizer it was made with:
    `scripts/core_convert_from_hf.py` records the HF model's) agrees on the vocabulary size, the end and padding
    ids and, where both tokenizers are local files, every token's id: the config's tokenizer, and the one each
    data file's folder records (`scripts/tokenize_text.py` writes the tokenizer.json it used beside train.npy).
    `RepoError` naming the keys; a checkpoint that records no tokenizer file is said in one line (rank 0), as
    the ids then cannot be compared token by token."""
    data = config.dataset.tokenizer
    if data.vocab_size > config.model.vocab_size:
        raise RepoError(
            f"dataset.tokenizer.vocab_size={data.vocab_size} does not fit model.vocab_size="
            f"{config.model.vocab_size}: the model embeds no token past its vocabulary; use the model's tokenizer"
        )
    if (
        not config.load_path
        or is_url(config.load_path)
        or not (Path(config.load_path) / "config.json").is_file()
    ):
        return  # a checkpoint that records no config (model and optimizer state only) records no tokenizer
    recorded = (read_config(config.load_path).get("dataset") or {}).get("tokenizer") or {}
    fix = f"tokenize the data with the model's tokenizer ({recorded.get('identifier', 'its tokenizer.json')})"
    for key in ("vocab_size", "eos_token_id", "pad_token_id"):
        want = recorded.get(key)  # a list of end ids where the HF model has several (Llama 3 Instruct)
        if want is not None and getattr(data, key) not in (want if isinstance(want, list) else [want]):
            raise RepoError(
                f"dataset.tokenizer.{key}={getattr(data, key)}, but load_path={config.load_path} was made with "
                f"{key}={recorded[key]}: {fix}"
            )
    theirs = Path(recorded.get("identifier") or "")
    if not theirs.is_file():
        if os.environ.get("RANK", "0") == "0":
            log.warning(
                f"load_path={config.load_path} records no tokenizer file ({recorded.get('identifier') or 'none'}): "
                "the data are checked against its vocabulary size and end and padding ids only, not token by "
                "token (convert the model from an HF directory that holds its tokenizer.json)"
            )
        return
    ours = {f"dataset.tokenizer.identifier={data.identifier}": Path(data.identifier)}
    paths = _data_paths(config.dataset)
    folders = datafolder.data_folders(paths, fetch_file)  # prepare_data.py's: `_check_data_folders`
    for path, folder, made in datafolder.beside_tokenizers(paths, folders):  # tokenize_text.py's
        ours[f"dataset.paths: {path} was made with {folder}/tokenizer.json, which"] = made
    for what, file in ours.items():
        if file.is_file() and (difference := vocabulary_difference(file, theirs)):
            raise RepoError(
                f"{what} is not the tokenizer of load_path={config.load_path} ({theirs}: {difference}): {fix}"
            )


def _check_data_folders(config: ExperimentConfig) -> None:
    """Every data folder of `scripts/prepare_data.py` that the dataset reads (each source's of a mix) is finished
    and made with the model's tokenizer: the tokenizer.json it records has the ids of the checkpoint's (of
    `dataset.tokenizer.identifier` without a local `load_path`), its end id is the dataset tokenizer's, and the
    model embeds its vocabulary (`olmo_repo.vocab`). `RepoError` naming the folder."""
    folders = datafolder.data_folders(_data_paths(config.dataset), fetch_file)
    theirs, of = Path(config.dataset.tokenizer.identifier), "dataset.tokenizer.identifier"
    if (
        config.load_path
        and not is_url(config.load_path)
        and (Path(config.load_path) / "config.json").is_file()
    ):
        recorded = (read_config(config.load_path).get("dataset") or {}).get("tokenizer") or {}
        if recorded.get("identifier"):
            theirs, of = Path(recorded["identifier"]), f"load_path={config.load_path}"
    for folder in folders:
        data = datafolder.manifest(folder, fetch_file)
        made, fix = f"{folder}/{data['tokenizer']}", datafolder.REMAKE
        if data["eos_token_id"] != config.dataset.tokenizer.eos_token_id:
            raise RepoError(
                f"{folder} ends documents with id {data['eos_token_id']}, but dataset.tokenizer.eos_token_id="
                f"{config.dataset.tokenizer.eos_token_id}: {fix}"
            )
        if data["vocab_size"] > config.model.vocab_size:
            raise RepoError(
                f"{folder} was made with a tokenizer of {data['vocab_size']} tokens, more than model.vocab_size="
                f"{config.model.vocab_size}: {fix}"
            )
        copy = datafolder.recorded_tokenizer(folder, data, fetch_file)
        if theirs.is_file() and (difference := vocabulary_difference(copy, theirs)):
            raise RepoError(
                f"{folder} was made with {made}, not the tokenizer of {of} ({theirs}: {difference}): {fix}"
            )


@dataclass
class MetricsFileCallback(Callback):
    """Rank 0 writes every logged step to `save_folder/metrics.jsonl` ({"step": N, name: value, ...}, full
    precision; one record per step, as the ai2-olmo side: `olmo_repo.metrics`). For a remote save folder the file stays local, named after it under the working directory:
    `s3://bucket/runs/a` -> `work_dir/metrics/s3/bucket/runs/a/metrics.jsonl` (OLMo-core's default working
    directory is shared by every remote run). On a resume the records after the checkpoint's step are dropped
    first: each step appears once, from the run that went on from it."""

    fname: str = "metrics.jsonl"

    def _path(self) -> Path:
        folder = self.trainer.save_folder
        if not is_url(folder):
            return Path(folder) / self.fname
        url = urlparse(folder)
        path = Path(self.trainer.work_dir, "metrics", url.scheme, url.netloc, url.path.strip("/"), self.fname)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def pre_train(self) -> None:
        if self.trainer.dp_process_group is not None and torch.distributed.get_rank() != 0:
            return
        trim_metrics(self._path(), self.step)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        append_metrics(self._path(), step, metrics)


@dataclass
class PositionsCallback(Callback):
    """The index blend's p on every RePo layer (`rope.set_index_blend`), and the positions' statistics.

    p = `modes.index_blend(blend_init, blend_steps, steps done)` (the schedule of the model config's RePo
    attention): set before each step's forward (the step under way has `global_step - 1` steps done), after
    each step (so in-loop evaluation, NIAH, scores with the p of the steps done) and before training starts (a
    resume: the loaded step). Its priority runs it before the evaluator callbacks.

    `train/positions/layer{i}/{stat}` (`olmo_repo.positions.position_stats`, the ai2-olmo side's too): the spread of
    the positions each RePo layer predicts, on the first micro-batch of each step, and the step's p while it is
    above 0."""

    priority: ClassVar[int] = 5  # OLMo-core's evaluator callbacks have 0: this one runs first
    blend_init: float = 0.0
    """p at step 0 (`pe_blend_init`)."""
    blend_steps: int = 0
    """Steps over which p falls to 0 (`pe_blend_steps`; 0: no blend)."""

    def _set_blend(self, steps_done: int) -> None:
        p = index_blend(self.blend_init, self.blend_steps, steps_done)
        set_index_blend(self.trainer.train_module.model, p)

    def pre_train(self) -> None:
        self._set_blend(self.trainer.global_step)

    def pre_step(self, batch: dict[str, Any]) -> None:
        self._set_blend(self.trainer.global_step - 1)
        self._observing = position_stats(self.trainer.train_module.model)
        self._stats = self._observing.__enter__()

    def pre_optim_step(self) -> None:
        self._observing.__exit__(None, None, None)
        for name, value in self._stats.items():
            self.trainer.record_metric(name, value)

    def post_step(self) -> None:
        self._set_blend(self.trainer.global_step)


@dataclass
class SignalStopCallback(Callback):
    """SIGUSR1 (SLURM's `--signal` before the time limit, `scancel --signal=USR1`) stops the run after the
    current step: OLMo-core's `cancel_run` (every rank stops at the same step) and its checkpointer's final save.
    `run` then requeues the SLURM job from rank 0."""

    stopped: bool = False

    def pre_train(self) -> None:
        signal.signal(signal.SIGUSR1, self._stop)

    def _stop(self, signum: int, frame: Any) -> None:
        self.stopped = True
        self.trainer.cancel_run("SIGUSR1 received")


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
