"""What an OLMo-core run checks before a process group starts (`check_experiment`), each problem one line naming
the key or file: the save folder (a run's, free, not too near a bucket's root), the lengths, the position modes
of every block, the `f_phi` section (and that a resume keeps it), the batch's split over the ranks, in-loop NIAH,
the local data files, the stage-1 checkpoint (whole, its keys against the model's), the tokenizer of the data
against the checkpoint's (`olmo_repo.vocab`), every data folder of `scripts/prepare_data.py`; last, a corrupt
newest checkpoint of the save folder is moved aside so that the resume loads the latest intact one."""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from urllib.parse import urlparse

from olmo_core.data import NumpyDatasetConfig
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.script_utils import ExperimentConfig

from ..data import folder as datafolder
from ..errors import RepoError, not_a_length
from ..modes import FPhiTraining, index_blend
from ..ownership import LOCK_FILE, check_free
from ..paths import is_url
from ..vocab import vocabulary_difference
from .attention import RepoAttentionConfig, repo_attention
from .checkpoint import CONFIG, fetch_file, latest_intact_checkpoint, read_config
from .niah import NiahCallbackConfig
from .stage1 import check_stage1

__all__ = ["check_experiment", "f_phi_training"]

log = logging.getLogger(__name__)


def f_phi_training(config: ExperimentConfig) -> FPhiTraining:
    """The run's `f_phi` section; the paper's defaults for an `ExperimentConfig` without one."""
    return getattr(config, "f_phi", None) or FPhiTraining()


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
