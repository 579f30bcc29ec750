"""Checks before any heavy work, so that a config that cannot train here stops with one error naming every
problem and what to change, and nothing is written to `save_folder` first."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch
from olmo.aliases import PathOrStr
from olmo.config import (
    DDPConfig,
    DDPGradSyncMode,
    DistributedStrategy,
    ShardedCheckpointerType,
    TrainConfig,
)
from olmo.exceptions import OLMoCheckpointError, OLMoConfigurationError
from olmo.torch_util import (
    get_global_rank,
    get_local_world_size,
)
from olmo.util import (
    file_size,
    is_url,
)
from torch.distributed.fsdp import (
    ShardingStrategy,
)

from ..data import folder as datafolder
from ..errors import RepoError, command, not_a_length
from ..integrity import checkpoint_problems, olmo_core_checkpoint_problem
from ..modes import repo_layer_ids
from ..upstream.olmo import fused_loss_available
from ..vocab import vocabulary_difference
from .config import fetch_file

log = logging.getLogger(__name__)


def _flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _local_data_paths(cfg: TrainConfig) -> list[tuple[str, str]]:
    """(config key, path) of every local data file of the train data and the evaluators."""
    out: list[tuple[str, str]] = []
    for key, data in [("data", cfg.data)] + [(f"evaluators[{e.label}].data", e.data) for e in cfg.evaluators]:
        out += [(f"{key}.paths", str(p)) for p in data.paths or []]
        for label, paths in (data.datasets or {}).items():
            out += [(f"{key}.datasets.{label}", str(p)) for p in paths]
        out += [(f"{key}.label_mask_paths", str(p)) for p in data.label_mask_paths or []]
    return [(k, p) for k, p in out if not is_url(p)]


def preflight(cfg: TrainConfig, *, cuda: bool, world_size: int, local_world_size: int | None = None) -> None:
    """Complete the config's defaults and check it, before any heavy work, for a run of `world_size` ranks
    (`local_world_size` per node; default: this process's torchrun environment).

    Raises one `OLMoConfigurationError` that lists every problem and what to change.
    """
    if cfg.distributed_strategy == DistributedStrategy.ddp and cfg.ddp is None:
        cfg.ddp = DDPConfig()

    problems: list[str] = []
    if cfg.model.max_sequence_length < 1:  # OLMo divides by it (its data loader's window count)
        problems.append(not_a_length("model.max_sequence_length", cfg.model.max_sequence_length))
    if cfg.run_name is None:
        problems.append("run_name is not set: pass --run_name=NAME")
    if cfg.distributed_strategy is None:
        problems.append("distributed_strategy is not set: pass --distributed_strategy=fsdp (GPU) or ddp")
    if cfg.fused_loss and not fused_loss_available():  # what OLMo's Trainer checks, after model build
        problems.append(
            "fused_loss=true needs flash-attn, which is not installed: pass --fused_loss=false "
            "(same loss, PyTorch kernel), or install the gpu extra on a CUDA machine"
        )
    if cfg.model.flash_attention and not _flash_attn_available():
        log.warning(
            "model.flash_attention=true but flash-attn is not installed: OLMo uses PyTorch SDPA instead"
        )
    fsdp = cfg.distributed_strategy == DistributedStrategy.fsdp
    if not cuda and cfg.precision != "fp32" and not (fsdp and cfg.fsdp.precision is not None):
        problems.append(
            f"precision={cfg.precision} on CPU needs FSDP's mixed precision (OLMo's Trainer autocasts on CUDA "
            "only, so it would silently train in fp32): pass --precision=fp32, or --distributed_strategy=fsdp "
            "with --fsdp.precision=mixed (or pure)"
        )
    if fsdp:
        problems += _check_fsdp(cfg, world_size, local_world_size)
    problems += _check_f_phi(cfg)
    if not cuda and cfg.model.init_device == "cuda":
        problems.append("model.init_device=cuda without CUDA: pass --model.init_device=cpu (or meta)")
    if cfg.ddp is not None and cfg.distributed_strategy == DistributedStrategy.ddp:
        if cfg.ddp.find_unused_params and cfg.ddp.grad_sync_mode != DDPGradSyncMode.micro_batch:
            problems.append("ddp.find_unused_params=true needs --ddp.grad_sync_mode=micro_batch")
    if cfg.global_train_batch_size % world_size:
        problems.append(
            f"global_train_batch_size={cfg.global_train_batch_size} is not divisible by the {world_size} ranks"
        )
    elif (per_rank := cfg.global_train_batch_size // world_size) % cfg.device_train_microbatch_size:
        problems.append(
            f"the per-rank batch {per_rank} (global_train_batch_size={cfg.global_train_batch_size} over "
            f"{world_size} rank(s)) is not a multiple of device_train_microbatch_size="
            f"{cfg.device_train_microbatch_size}: pass --device_train_microbatch_size=N with N dividing {per_rank}"
        )

    missing = [(key, path) for key, path in _local_data_paths(cfg) if not Path(path).is_file()]
    if missing:
        shown = "; ".join(f"{key}: {path}" for key, path in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        problems.append(
            f"{len(missing)} data file(s) do not exist: {shown}{more}. Fix the paths (or data_prefix), or "
            "build the demo corpus with `make demo`"
        )

    problems += _check_tokenizer(cfg)
    if cfg.load_path is not None and not is_url(cfg.load_path) and not Path(cfg.load_path).is_dir():
        problems.append(
            f"load_path={cfg.load_path} is not a directory: pass the checkpoint folder (or a URL)"
        )
    elif cfg.load_path is not None and (
        problem := olmo_core_checkpoint_problem(
            cfg.load_path,
            f"{command('core_convert_to_hf')}, then {command('convert_from_hf')} (or train it with "
            f"{command('core_train')})",
        )
    ):
        problems.append(f"load_path: {problem}")
    problems += _check_save_folders(cfg)
    if problems:
        raise OLMoConfigurationError("config cannot train here: " + "; ".join(problems))  # one line


def _check_tokenizer(cfg: TrainConfig) -> list[str]:
    """A local tokenizer file reads as one (OLMo reads it in every rank, with a traceback otherwise), every
    data folder of `scripts/prepare_data.py` that `data.paths` reads was made with it and the model's end id,
    and every file of `scripts/tokenize_text.py` (the tokenizer.json beside it) with it too, as OLMo-core's
    side checks them."""
    path = Path(cfg.tokenizer.identifier)
    if not path.is_file():  # a Hugging Face Hub name, which OLMo fetches
        return []
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a file that is not one
        return [f"tokenizer.identifier={path} is not a tokenizer file ({e}): pass a tokenizer.json"]
    problems = []
    paths = [str(p) for p in cfg.data.paths or []]
    folders = datafolder.data_folders(paths, fetch_file)
    for data_path, folder, made in datafolder.beside_tokenizers(paths, folders):  # scripts/tokenize_text.py's
        if difference := vocabulary_difference(made, path):
            problems.append(f"data.paths: {data_path} was made with {folder}/tokenizer.json, another tokenizer "
                            f"than tokenizer.identifier={path} ({difference}): tokenize it with the model's "
                            "tokenizer")  # fmt: skip
    for folder in folders:
        data = datafolder.manifest(folder, fetch_file)
        if data["eos_token_id"] != cfg.model.eos_token_id:
            problems.append(f"{folder} ends documents with id {data['eos_token_id']}, but model.eos_token_id="
                            f"{cfg.model.eos_token_id}: {datafolder.REMAKE}")  # fmt: skip
            continue
        try:
            made = datafolder.recorded_tokenizer(folder, data, fetch_file)
        except RepoError as e:
            problems.append(str(e))
            continue
        if difference := vocabulary_difference(made, path):
            problems.append(f"{folder} was made with another tokenizer than tokenizer.identifier={path} "
                            f"({difference}): {datafolder.REMAKE}")  # fmt: skip
    return problems


# Why ai2-olmo 0.6.0's other sharded checkpointers fail with torch 2.13 (`olmo_core` works).
_BROKEN_CHECKPOINTERS = {
    ShardedCheckpointerType.torch_new: "fails at the first save (its storage reader lacks abstract methods of "
    "torch's checkpoint API)",
    ShardedCheckpointerType.torch_legacy: "saves files that cannot be resumed (their pickled ShardedTensors "
    "need builtins.getattr, which torch.load's safe loader rightly refuses)",
    ShardedCheckpointerType.local: "raises NotImplementedError on torch >= 2.3 (it reads FSDP internals)",
}


HYBRID_STRATEGIES = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)


def hybrid_replicas(cfg: TrainConfig, world_size: int, local_world_size: int | None = None) -> int:
    """HYBRID_SHARD's number of model replicas: the config's, else one per node."""
    return cfg.fsdp.hybrid_sharding_num_model_replicas or world_size // (
        local_world_size or get_local_world_size()
    )


def _check_fsdp(cfg: TrainConfig, world_size: int, local_world_size: int | None) -> list[str]:
    problems = []
    for key in ("sharded_checkpointer", "load_path_sharded_checkpointer"):
        name = getattr(cfg, key)
        if name in _BROKEN_CHECKPOINTERS:
            problems.append(
                f"{key}={name} {_BROKEN_CHECKPOINTERS[name]} with torch {torch.__version__}: "
                f"pass --{key}=olmo_core"
            )
    if cfg.sharded_checkpointer == ShardedCheckpointerType.olmo_core and not cfg.fsdp.use_orig_params:
        problems.append("sharded_checkpointer=olmo_core needs --fsdp.use_orig_params=true")
    if cfg.fsdp.sharding_strategy in HYBRID_STRATEGIES:
        replicas = hybrid_replicas(cfg, world_size, local_world_size)
        if replicas <= 0 or world_size % replicas:
            problems.append(
                f"fsdp.hybrid_sharding_num_model_replicas={replicas} must be positive and divide the "
                f"{world_size} ranks"
            )
        elif replicas == world_size > 1:
            # torch then falls back to NO_SHARD but all-reduces gradients within the replica of one rank:
            # the replicas silently train apart (pytorch/pytorch#154888).
            problems.append(
                f"fsdp.sharding_strategy={cfg.fsdp.sharding_strategy.name} with {replicas} replicas of one rank "
                "each does not synchronise gradients in torch: pass a smaller "
                "--fsdp.hybrid_sharding_num_model_replicas, or --distributed_strategy=ddp"
            )
    return problems


def _check_f_phi(cfg: TrainConfig) -> list[str]:
    """The `f_phi` section (the rule set's checks, and what this trainer cannot do): FSDP without
    `use_orig_params` flattens f_phi's weights with the others, so they can have no lr, weight decay or
    `requires_grad` of their own."""
    f_phi = getattr(cfg, "f_phi", None)
    if f_phi is None:  # a stock TrainConfig
        return []
    try:
        f_phi.check(has_repo=bool(repo_layer_ids(cfg.model)))
    except ValueError as e:
        return [str(e)]
    own = [f"f_phi.only={str(f_phi.only).lower()}"] if f_phi.only else []
    own += [f"f_phi.lr_multiplier={f_phi.lr_multiplier}"] if f_phi.lr_multiplier != 1.0 else []
    own += [f"f_phi.weight_decay={f_phi.weight_decay}"] if f_phi.weight_decay is not None else []
    if own and cfg.distributed_strategy == DistributedStrategy.fsdp and not cfg.fsdp.use_orig_params:
        return [
            f"{own[0]} needs --fsdp.use_orig_params=true (FSDP otherwise flattens f_phi's weights with the "
            "others, which then share one learning rate, weight decay and requires_grad)"
        ]
    return []


def _check_save_folders(cfg: TrainConfig) -> list[str]:
    if is_url(cfg.save_folder):
        return [
            f"save_folder={cfg.save_folder} is a URL, but OLMo writes checkpoints to a local folder first: "
            "pass a local --save_folder and put the URL in --remote_save_folder (uploads go there)"
        ]
    # Writable where it will be created, without creating it: a failed check leaves no empty folder behind.
    existing = Path(cfg.save_folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        return [
            f"save_folder={cfg.save_folder} is not writable ({e.strerror}): pass a writable --save_folder"
        ]
    remote = cfg.remote_save_folder
    if remote is not None and urlparse(remote).scheme == "s3":
        import boto3
        import botocore.exceptions

        try:
            boto3.client("s3").head_bucket(Bucket=urlparse(remote).netloc)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            return [
                f"remote_save_folder={remote}: bucket not reachable ({e}); check the bucket name, credentials "
                "and AWS_ENDPOINT_URL"
            ]
    return []


@contextmanager
def removed_if_failed(save_folder: PathOrStr) -> Iterator[None]:
    """Remove `save_folder` if this start created it and fails before its first checkpoint: what it wrote
    there (config.yaml, wandb/, data order files) belongs to a run that never started."""
    folder = Path(save_folder)
    created = not is_url(str(save_folder)) and not folder.exists()
    try:
        yield
    except BaseException:
        if created and folder.is_dir() and not any(folder.glob("step*")) and get_global_rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def check_load_path_files(cfg: TrainConfig) -> None:
    """A local load_path holds intact copies of the files the load will read (unsharded: model.pt, and
    optim.pt and train.pt unless reset; sharded: every *.pt present), before anything is written."""
    if cfg.load_path is None or is_url(cfg.load_path) or not Path(cfg.load_path).is_dir():
        return
    needed: list[str] = []
    if is_unsharded(cfg.load_path):
        resets = {"optim.pt": "reset_optimizer_state", "train.pt": "reset_trainer_state"}
        needed = ["model.pt"] + [name for name, reset in resets.items() if not getattr(cfg, reset)]
        for name in needed[1:]:
            if not (Path(cfg.load_path) / name).is_file():
                raise OLMoCheckpointError(
                    f"{cfg.load_path} has no {name}: pass --{resets[name]}=true to start it fresh"
                )
    if problems := checkpoint_problems(cfg.load_path, tuple(needed)):
        raise OLMoCheckpointError(
            f"load_path={cfg.load_path} cannot be loaded: {'; '.join(problems)}. Restore the file from a copy "
            "or re-create it"
        )


def is_unsharded(path: PathOrStr) -> bool:
    """An unsharded checkpoint: named `*-unsharded`, or a folder with model.pt/model.safetensors in it."""
    base = str(path).rstrip("/")
    if base.endswith("-unsharded"):
        return True
    for name in ("model.pt", "model.safetensors"):
        if not is_url(base):
            if Path(base, name).is_file():
                return True
        elif urlparse(base).scheme in ("http", "https"):
            import requests

            if requests.head(f"{base}/{name}", allow_redirects=True, timeout=60).ok:
                return True
        else:
            try:
                file_size(f"{base}/{name}")
                return True
            except FileNotFoundError:
                continue
    return False
