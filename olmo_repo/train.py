"""Training: OLMo's own Trainer, data loader and checkpointer driving a RePo model, on GPU or CPU.

This ports the behaviour of ai2-olmo 0.6.0's `scripts/train.py` (not shipped in the wheel): seeding, data
loader, evaluators, model build and wrap (FSDP: meta init, the config's wrap policy and mixed precision,
then `reset_parameters`), optimizer and scheduler, W&B, the pre-train checkpoint rule, `load_path` with the
reset flags, and resuming from the latest checkpoint. Deltas from the stock script:

- Device: nccl with CUDA, gloo without; the config's strategy either way. FSDP runs on CPU as on GPU (the
  sharding strategy, HYBRID_SHARD on a CPU device mesh, the wrap policy, `fsdp.precision` as FSDP mixed
  precision: the only way to train in bf16 on CPU, as OLMo's Trainer autocasts on CUDA only). Settings
  that cannot work here fail before training with what to change. Without torchrun a one-process group
  is set up.
- `preflight` fails before any heavy work on missing data files, an unwritable `save_folder`, an
  unreachable s3 `remote_save_folder`, GPU-only settings and sharded checkpointers that fail on torch 2.13.
- Resume is automatic, as if `try_load_latest_save` were set: the latest intact checkpoint in `save_folder`
  (a corrupt newer one is moved aside), else in `remote_save_folder`, else `load_path`. A changed model is
  refused, other changed keys are logged. Rerunning a finished run does nothing. A folder without a
  checkpoint is a new run (an earlier start that failed before its first checkpoint does not block it).
- Nothing is written to `save_folder` before `load_path`'s files are checked (present and not truncated);
  W&B gets a bounded start with a one-line failure; `metrics.jsonl` drops the steps a resumed run repeats.
- SIGUSR1 (SLURM's `--signal` before the time limit) stops the run after the current step with a
  checkpoint, on every rank at the same step; under SLURM rank 0 then requeues the job, which resumes.
- DDP accepts any `init_device` (stock: `cuda` only). DDP, and FSDP without meta init, materialise and
  initialise the whole model before the wrap (stock FSDP initialises after it, shard by shard).
- `RepoTrainer`: stage-1 initialisation (`RepoCheckpointer`), the spread of the predicted positions per
  RePo layer at the log interval, every logged step as a JSON line in `save_folder/metrics.jsonl`, and the
  SIGUSR1 stop.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO, TypeVar
from urllib.parse import urlparse

import numpy as np
import olmo.train
import olmo_core.distributed.checkpoint as olmo_core_checkpoint
import torch
import torch.distributed as dist
import wandb
from olmo.aliases import PathOrStr
from olmo.config import (
    CheckpointType,
    DDPConfig,
    DDPGradSyncMode,
    DistributedStrategy,
    ShardedCheckpointerType,
    TrainConfig,
)
from olmo.data import build_train_dataloader
from olmo.eval import build_evaluators
from olmo.exceptions import OLMoCheckpointError, OLMoConfigurationError, OLMoError
from olmo.model import OLMo
from olmo.optim import BoltOnWarmupScheduler, build_optimizer, build_scheduler
from olmo.torch_util import (
    barrier,
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_world_size,
    seed_all,
    synchronize_flag,
)
from olmo.train import Trainer
from olmo.util import (
    add_cached_path_clients,
    clean_opt,
    file_size,
    find_latest_checkpoint,
    is_url,
    log_extra_field,
    prepare_cli_environment,
    resource_path,
)
from omegaconf import OmegaConf as om
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import (
    OptimStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from .block import RepoSequentialBlock
from .checkpoint import RepoCheckpointer, checkpoint_problems, latest_intact_checkpoint
from .config import PositionMode, RepoTrainConfig
from .registry import build_model

__all__ = [
    "RepoTrainer",
    "build_trainer",
    "init_distributed",
    "main",
    "patch_torch_for_olmo",
    "preflight",
    "train",
]

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
_POSITIONS = "train/positions/"

STOP_REQUESTED = threading.Event()
"""Set by SIGUSR1 (handler installed by `train`): save a checkpoint after the current step and stop."""


_STOCK_SET_STATE_DICT_TYPE = FSDP.set_state_dict_type


def _set_state_dict_type_without_offload(
    module: torch.nn.Module,
    state_dict_type: StateDictType,
    state_dict_config: StateDictConfig | None = None,
    optim_state_dict_config: OptimStateDictConfig | None = None,
) -> StateDictSettings:
    """`FSDP.set_state_dict_type` with `offload_to_cpu=False` in both configs (see `patch_torch_for_olmo`)."""
    return _STOCK_SET_STATE_DICT_TYPE(
        module,
        state_dict_type,
        state_dict_config and dataclasses.replace(state_dict_config, offload_to_cpu=False),
        optim_state_dict_config and dataclasses.replace(optim_state_dict_config, offload_to_cpu=False),
    )


_STOCK_INIT_OPTIMIZER_STATE = olmo_core_checkpoint.init_optimizer_state


def _init_optimizer_state_inertly(optim: torch.optim.Optimizer) -> None:
    """olmo_core's `init_optimizer_state` leaving parameters and step counts as they are (see
    `patch_torch_for_olmo`): its zero-gradient step runs at lr = 0 and weight decay 0 (parameters unchanged
    bit for bit, moments stay 0), then the step counters it advanced go back to 0."""
    if optim.state:
        return
    settings = [(group["lr"], group["weight_decay"]) for group in optim.param_groups]
    for group in optim.param_groups:
        group["lr"] = group["weight_decay"] = 0.0
    _STOCK_INIT_OPTIMIZER_STATE(optim)
    for group, (lr, weight_decay) in zip(optim.param_groups, settings):
        group["lr"], group["weight_decay"] = lr, weight_decay
    for state in optim.state.values():
        if "step" in state:
            state["step"].zero_()


def patch_torch_for_olmo() -> None:
    """Assumptions of ai2-olmo 0.6.0 that break on current torch, on CPU, or in its olmo_core checkpointer,
    fixed here and only here. Idempotent; on a CUDA machine 2 and 4 apply.

    1. `Trainer.trainer_state_dict` calls `torch.cuda.get_rng_state()` unguarded, which raises on a
       CPU-only torch. Without CUDA, the CUDA RNG state is saved as an empty tensor and restoring it is a
       no-op (there is no CUDA generator to restore).
    2. torch >= 2.6 loads with `weights_only=True`, and OLMo's `train.pt` holds `pathlib` paths and numpy's
       RNG state. Exactly those types are allowed, instead of turning the safe loader off.
    3. OLMo asks FSDP for state dicts with `offload_to_cpu=True` (the unsharded save, its restore, stage-1
       init). torch implements the offload as `.cpu()` and then frees or reuses the buffer it gathered
       into; on CPU `.cpu()` returns that very buffer. The model state dict then reads freed memory
       (SIGSEGV in torch 2.13) and the optimizer state dict silently aliases each parameter's `exp_avg`
       to its `exp_avg_sq`. Without CUDA everything is on CPU already: FSDP's state-dict settings are
       applied with `offload_to_cpu=False`, whatever the caller asked.
    4. `sharded_checkpointer: olmo_core` creates a missing optimizer state (a fresh optimizer on resume, the
       pre-train save) with a real AdamW step on zero gradients: every resume from a sharded checkpoint
       decayed the weights it had just loaded by (1 - lr * weight_decay), and a run from scratch counted
       one step too many (Adam's bias correction). The state is created without either effect.
    """
    if not torch.cuda.is_available():
        torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)  # type: ignore[assignment]
        torch.cuda.set_rng_state = lambda new_state, device="cuda": None  # type: ignore[assignment]
        FSDP.set_state_dict_type = staticmethod(_set_state_dict_type_without_offload)  # type: ignore[method-assign]
    olmo_core_checkpoint.init_optimizer_state = _init_optimizer_state_inertly
    torch.serialization.add_safe_globals(
        [
            pathlib.PosixPath,
            np.ndarray,
            np.dtype,
            type(np.dtype(np.uint32)),
            np.core.multiarray._reconstruct,  # type: ignore[attr-defined]
        ]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> torch.device:
    """Join the process group (nccl on CUDA, gloo on CPU) and return this rank's device.

    Under torchrun the group comes from its environment; started without it, the process forms a group of
    one on a free loopback port (OLMo's rank helpers then read rank 0 and world size 1).
    """
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{get_local_rank()}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"timeout": timedelta(minutes=30)}
        if cuda:
            kwargs["device_id"] = device
        if "RANK" not in os.environ:
            kwargs.update(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        dist.init_process_group("nccl" if cuda else "gloo", **kwargs)
    return device


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


def preflight(cfg: TrainConfig, *, cuda: bool, world_size: int) -> None:
    """Complete the config's defaults and check it, before any heavy work.

    Raises one `OLMoConfigurationError` that lists every problem and what to change.
    """
    if cfg.distributed_strategy == DistributedStrategy.ddp and cfg.ddp is None:
        cfg.ddp = DDPConfig()

    problems: list[str] = []
    if cfg.run_name is None:
        problems.append("run_name is not set: pass --run_name=NAME")
    if cfg.distributed_strategy is None:
        problems.append("distributed_strategy is not set: pass --distributed_strategy=fsdp (GPU) or ddp")
    if cfg.fused_loss and olmo.train.fused_loss_fn is None:  # what OLMo's Trainer checks, after model build
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
        problems += _check_fsdp(cfg, world_size)
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

    if cfg.load_path is not None and not is_url(cfg.load_path) and not Path(cfg.load_path).is_dir():
        problems.append(
            f"load_path={cfg.load_path} is not a directory: pass the checkpoint folder (or a URL)"
        )
    problems += _check_save_folders(cfg)
    if problems:
        raise OLMoConfigurationError("config cannot train here:\n  - " + "\n  - ".join(problems))


# Why ai2-olmo 0.6.0's other sharded checkpointers fail with torch 2.13 (`olmo_core` works).
_BROKEN_CHECKPOINTERS = {
    ShardedCheckpointerType.torch_new: "fails at the first save (its storage reader lacks abstract methods of "
    "torch's checkpoint API)",
    ShardedCheckpointerType.torch_legacy: "saves files that cannot be resumed (their pickled ShardedTensors "
    "need builtins.getattr, which torch.load's safe loader rightly refuses)",
    ShardedCheckpointerType.local: "raises NotImplementedError on torch >= 2.3 (it reads FSDP internals)",
}


_HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)


def _hybrid_replicas(cfg: TrainConfig, world_size: int) -> int:
    """HYBRID_SHARD's number of model replicas: the config's, else one per node."""
    return cfg.fsdp.hybrid_sharding_num_model_replicas or world_size // get_local_world_size()


def _check_fsdp(cfg: TrainConfig, world_size: int) -> list[str]:
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
    if cfg.fsdp.sharding_strategy in _HYBRID:
        replicas = _hybrid_replicas(cfg, world_size)
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


def _check_save_folders(cfg: TrainConfig) -> list[str]:
    if is_url(cfg.save_folder):
        return [
            f"save_folder={cfg.save_folder} is a URL, but OLMo writes checkpoints to a local folder first: "
            "pass a local --save_folder and put the URL in --remote_save_folder (uploads go there)"
        ]
    try:
        Path(cfg.save_folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cfg.save_folder):
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


def _repo_blocks(model: torch.nn.Module) -> list[RepoSequentialBlock]:
    return [
        m for m in model.modules() if isinstance(m, RepoSequentialBlock) and m.pe_mode == PositionMode.repo
    ]


def _is_unsharded(path: PathOrStr) -> bool:
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


class RepoTrainer(Trainer):
    """OLMo's `Trainer` with these deltas:

    - unsharded checkpoints are restored by `RepoCheckpointer` (stage-1 init; complete checkpoints as stock);
    - a `load_path` without `-unsharded` in its name that holds model.pt is read as unsharded;
    - at log steps, min/max/std of the predicted positions of every RePo layer (first micro-batch, this rank)
      join the metrics (W&B, metrics.jsonl; not the console) as `train/positions/layer{i}/{min,max,std}`;
    - rank 0 appends every console-logged metrics dict to `save_folder/metrics.jsonl` at full precision;
    - after every step the ranks agree whether rank 0 got SIGUSR1 (`STOP_REQUESTED`); if so, OLMo's cancel
      path ends the run at this step, `stopped_on_signal` is set, and `fit` makes sure a checkpoint of this
      step exists (OLMo's path writes none under DDP without `save_interval_unsharded`);
    - `close` finishes W&B without the `quiet` argument that current wandb lacks.
    """

    stopped_on_signal: bool = False
    _stop_interval: int | None = None  # the configured canceled_check_interval while a stop is pending

    def restore_checkpoint(
        self, load_path: PathOrStr, *, checkpoint_type: CheckpointType | None = None, **kwargs: Any
    ) -> None:
        if checkpoint_type is None and _is_unsharded(load_path):
            checkpoint_type = CheckpointType.unsharded
        super().restore_checkpoint(load_path, checkpoint_type=checkpoint_type, **kwargs)

    def restore_unsharded_checkpoint(
        self,
        load_path: PathOrStr,
        local_cache: PathOrStr | None = None,
        *,
        load_optimizer_state: bool = True,
        load_trainer_state: bool = True,
    ) -> None:
        self.optim.zero_grad(set_to_none=True)
        trainer_state = RepoCheckpointer(self.cfg).restore_checkpoint(
            load_path,
            self.dist_model,
            self.optim,
            local_cache=local_cache,
            load_optimizer_state=load_optimizer_state,
        )
        if load_trainer_state:
            self.load_trainer_state_dict(trainer_state)
        barrier()

    def train_step(self, batch: dict[str, Any], reduce_global_loss: bool = True) -> dict[str, float]:
        metrics = self._train_step_with_positions(batch, reduce_global_loss)
        # OLMo's loop asks `check_if_cancelled` only every `canceled_check_interval` steps; a stop must come
        # within one step, so on a stop request the loop is made to ask at this very step.
        if synchronize_flag(STOP_REQUESTED.is_set(), self.device):
            self._stop_interval = self.cfg.canceled_check_interval
            self.cfg.canceled_check_interval = 1
        return metrics

    def fit(self) -> None:
        super().fit()
        if self.stopped_on_signal and self.global_step not in (
            self.last_sharded_checkpoint_step,
            self.last_unsharded_checkpoint_step,
        ):
            log.info("Saving unsharded checkpoint...")
            path, _ = self.save_checkpoint(CheckpointType.unsharded)
            log.info("Unsharded checkpoint saved to %s", path)

    def check_if_cancelled(self) -> tuple[bool, int]:
        if self._stop_interval is None:
            return super().check_if_cancelled()
        self.cfg.canceled_check_interval = self._stop_interval  # before the checkpoint saves the config
        self.stopped_on_signal = True
        log.warning("SIGUSR1: saving a checkpoint at step %d and stopping", self.global_step)
        return True, 0  # no extra steps: the checkpoint is the last step trained

    def _train_step_with_positions(self, batch: dict[str, Any], reduce_global_loss: bool) -> dict[str, float]:
        if not reduce_global_loss:  # not a log step
            return super().train_step(batch, reduce_global_loss)
        stats: dict[str, float] = {}

        def record(block: RepoSequentialBlock, args: tuple[Any, ...]) -> None:
            prefix = f"{_POSITIONS}layer{block.layer_id}"
            if f"{prefix}/std" in stats:  # later micro-batches and activation-checkpoint recomputes
                return
            with torch.no_grad():
                z = block.predict_positions(args[0])  # [B, H, T]
                stats.update({f"{prefix}/min": z.min().item(), f"{prefix}/max": z.max().item()})
                stats[f"{prefix}/std"] = z.std().item()

        hooks = [b.register_forward_pre_hook(record) for b in _repo_blocks(self.model)]
        try:
            metrics = super().train_step(batch, reduce_global_loss)
        finally:
            for h in hooks:
                h.remove()
        metrics.update(stats)
        return metrics

    def close(self, exit_code: int = 0) -> None:
        # Stock close calls wandb.finish(..., quiet=True); wandb 0.31 has no `quiet`. Finishing here first
        # leaves stock close nothing to finish.
        if wandb.run is not None:
            wandb.finish(exit_code=exit_code)
        super().close(exit_code)

    def log_metrics_to_console(self, prefix: str, metrics: dict[str, float]) -> None:
        # Three position numbers per RePo layer (33 lines for the 1B) would drown the console: W&B and
        # metrics.jsonl have them.
        super().log_metrics_to_console(
            prefix, {k: v for k, v in metrics.items() if not k.startswith(_POSITIONS)}
        )
        if get_global_rank() == 0:
            with open(Path(self.cfg.save_folder) / METRICS_FILE, "a") as f:
                f.write(json.dumps({"step": self.global_step, **metrics}) + "\n")


T = TypeVar("T")


def _decided_on_rank0(decide: Callable[[], T]) -> T:
    """`decide()` on rank 0 (it reads the run folder), and its result, or the OLMoError it raised, on every
    rank, so that all ranks go on or stop together."""
    outcome: list[Any] = [None]
    if get_global_rank() == 0:
        try:
            outcome[0] = (decide(), None)
        except OLMoError as e:
            outcome[0] = (None, e)
    dist.broadcast_object_list(outcome, src=0)
    result, error = outcome[0]
    if error is not None:
        raise error
    return result


def _latest_checkpoint(cfg: TrainConfig) -> str | None:
    """The latest intact checkpoint in save_folder (a corrupt newer one is moved aside with a warning, see
    `latest_intact_checkpoint`), else the latest in remote_save_folder. Includes the pre-train checkpoint
    `step0-unsharded`, which OLMo's `find_latest_checkpoint` skips, so a run killed before its first save
    also restarts with the same command."""

    def find() -> str | None:
        if (
            Path(cfg.save_folder).is_dir()
            and (local := latest_intact_checkpoint(cfg.save_folder)) is not None
        ):
            return str(local)
        if cfg.remote_save_folder is not None and (remote := find_latest_checkpoint(cfg.remote_save_folder)):
            return str(remote)
        return None

    return _decided_on_rank0(find)


# Keys that resuming itself sets, and model keys that change neither the parameters nor what they compute.
_RESUME_KEYS = {"load_path", "restore_dataloader", "reset_optimizer_state", "reset_trainer_state"}
_MODEL_RUNTIME_KEYS = {"model.init_device", "model.flash_attention", "model.precision"}


def _flat(config: TrainConfig) -> dict[str, Any]:
    """{dotted key: value} of a config as its config.yaml holds it."""
    with tempfile.TemporaryDirectory() as tmp:
        config.save(Path(tmp) / "config.yaml")
        tree = om.to_container(om.load(Path(tmp) / "config.yaml"), resolve=True)

    def walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, f"{prefix}{key}.")
        else:
            yield prefix.rstrip("."), node

    return dict(walk(tree, ""))


def _check_resumed_config(cfg: TrainConfig, checkpoint: str) -> None:
    """Compare this run's config with the one `checkpoint` was saved with: a different model is refused with
    the keys that differ (it would load as a stage-1 init, or fail); other changed keys are logged."""

    def changes() -> dict[str, tuple[Any, Any]]:
        saved = _flat(type(cfg).load(resource_path(checkpoint, "config.yaml"), validate_paths=False))
        now = _flat(cfg)
        keys = sorted((saved.keys() | now.keys()) - _RESUME_KEYS)
        return {k: (saved.get(k), now.get(k)) for k in keys if saved.get(k) != now.get(k)}

    def shown(items: dict[str, tuple[Any, Any]]) -> str:
        return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in items.items())

    changed = _decided_on_rank0(changes)
    model = {k: v for k, v in changed.items() if k.startswith("model.") and k not in _MODEL_RUNTIME_KEYS}
    if model:
        raise OLMoConfigurationError(
            f"save_folder={cfg.save_folder} holds checkpoints of a different model ({checkpoint}): "
            f"{shown(model)}. Train this config in a new --save_folder (add --load_path={checkpoint} to start "
            "from that checkpoint)"
        )
    if changed:
        log.warning("Resuming %s with settings changed since: %s", checkpoint, shown(changed))


def _check_load_path_files(cfg: TrainConfig) -> None:
    """A local load_path holds intact copies of the files the load will read (unsharded: model.pt, and
    optim.pt and train.pt unless reset; sharded: every *.pt present), before anything is written."""
    if cfg.load_path is None or is_url(cfg.load_path) or not Path(cfg.load_path).is_dir():
        return
    needed: list[str] = []
    if _is_unsharded(cfg.load_path):
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


def _earlier_start_here(cfg: TrainConfig) -> bool:
    """Whether save_folder/config.yaml is from an earlier start of a run in this folder (its save_folder is
    this one) that failed or was killed before its first checkpoint. One that some other program wrote there
    is refused unless --save_overwrite."""
    saved = Path(cfg.save_folder) / "config.yaml"
    if not saved.is_file():
        return False
    try:
        folder = om.load(saved).get("save_folder")
    except Exception:  # not a YAML mapping: not ours
        folder = None
    if folder is not None and Path(str(folder)).resolve() == Path(cfg.save_folder).resolve():
        return True
    if cfg.save_overwrite:
        return False
    raise OLMoConfigurationError(
        f"{saved} exists and was not written by a run in this folder: use a new save_folder, or --save_overwrite"
    )


def _start_wandb(cfg: TrainConfig) -> None:
    """`wandb.init` for the run, bounded by W&B's own `WANDB_INIT_TIMEOUT` (90 s by default): without network
    it would wait silently and then fail with a traceback; here the wait is announced and a failure is one
    line saying how to train without reaching W&B."""
    assert cfg.wandb is not None
    wandb_dir = Path(cfg.save_folder) / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", 90))
    mode = os.environ.get("WANDB_MODE", "online")
    log.info("Starting W&B (%s; gives up after %.0f s, WANDB_INIT_TIMEOUT)", mode, timeout)
    hooks = sys.excepthook, sys.exit  # wandb.init replaces them with ones that print tracebacks
    try:
        wandb.init(
            dir=wandb_dir,
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            group=cfg.wandb.group,
            name=cfg.wandb.name,
            tags=cfg.wandb.tags,
            config=cfg.asdict(exclude=["wandb"]),
            settings=wandb.Settings(init_timeout=timeout),
        )
    except wandb.errors.Error as e:
        sys.excepthook, sys.exit = hooks
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise OLMoConfigurationError(
            f"W&B did not start ({reason}): on a machine without network set WANDB_MODE=offline (upload later "
            "with `wandb sync`), or pass --wandb=null to train without W&B"
        ) from None


def _trim_metrics(path: Path, step: int) -> None:
    """Drop the records after `step` (and a line cut short by a kill) from metrics.jsonl: the resumed run
    logs those steps again."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)

    def keep(line: str) -> bool:
        try:
            return line.endswith("\n") and json.loads(line)["step"] <= step
        except (ValueError, KeyError, TypeError):
            return False

    kept = [line for line in lines if keep(line)]
    if len(kept) < len(lines):
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(kept))
        partial.replace(path)
        log.info(
            "%s: %d records after step %d dropped (logged again now)", path, len(lines) - len(kept), step
        )


def _wrap(cfg: TrainConfig, model: OLMo, device: torch.device) -> DDP | FSDP:
    if cfg.distributed_strategy == DistributedStrategy.ddp:
        assert cfg.ddp is not None
        log.info("Wrapping model with DDP...")
        model = model.to_empty(device=device) if cfg.model.init_device == "meta" else model.to(device)
        model.reset_parameters()  # before the wrap: DDP then broadcasts rank 0's values
        return DDP(model, find_unused_parameters=cfg.ddp.find_unused_params)
    log.info("Wrapping model with FSDP...")
    # Unless on the meta device (whose point is that no rank holds the whole model), the whole model is
    # initialised before the wrap, as for DDP. After the wrap each rank would draw its shard from the same
    # seeded stream, and the shards repeat each other's values (stock OLMo, and still so with meta init).
    meta = cfg.model.init_device == "meta"
    if not meta:
        model = model.to(device)
        model.reset_parameters()
    hybrid: dict[str, Any] = {}
    if cfg.fsdp.sharding_strategy in _HYBRID:  # replicas checked by preflight
        replicas = _hybrid_replicas(cfg, get_world_size())
        hybrid["device_mesh"] = init_device_mesh(device.type, (replicas, get_world_size() // replicas))
    dist_model = FSDP(
        model,
        sharding_strategy=cfg.fsdp.sharding_strategy,
        mixed_precision=cfg.fsdp_precision,
        auto_wrap_policy=model.get_fsdp_wrap_policy(cfg.fsdp.wrapping_strategy),
        use_orig_params=cfg.fsdp.use_orig_params,
        limit_all_gathers=True,
        device_id=device,
        param_init_fn=lambda module: module.to_empty(device=device),  # each parameter initialised once
        **hybrid,
    )
    if meta:
        model.reset_parameters()
    return dist_model


def build_trainer(cfg: TrainConfig, device: torch.device) -> RepoTrainer:
    """Everything up to `fit()`: config handling, W&B, data, model, optimizer, checkpoint loading.

    Expects `preflight(cfg, ...)` to have run and the process group to be up.
    """
    log_extra_field("run_name", cfg.run_name)
    if (cfg.reset_optimizer_state or cfg.reset_trainer_state) and cfg.load_path is None:
        log.warning("reset_optimizer_state/reset_trainer_state have no effect without load_path")

    cfg.model.precision = cfg.precision
    cfg.device_train_batch_size = cfg.global_train_batch_size // get_world_size()
    cfg.device_train_grad_accum = cfg.device_train_batch_size // cfg.device_train_microbatch_size
    if cfg.optimizer.no_decay_norm_and_bias is not None:
        log.warning(
            "no_decay_norm_and_bias is deprecated; it overrides decay_norm_and_bias and decay_embeddings"
        )
        cfg.optimizer.decay_norm_and_bias = not cfg.optimizer.no_decay_norm_and_bias
        cfg.optimizer.decay_embeddings = not cfg.optimizer.no_decay_norm_and_bias
        cfg.optimizer.no_decay_norm_and_bias = None
    if cfg.distributed_strategy == DistributedStrategy.ddp:  # DDP writes unsharded checkpoints only
        if cfg.save_interval_unsharded is None:
            cfg.save_interval_unsharded = cfg.save_interval
        if cfg.save_num_unsharded_checkpoints_to_keep == 0:
            cfg.save_num_unsharded_checkpoints_to_keep = cfg.save_num_checkpoints_to_keep

    resume_from = _latest_checkpoint(cfg)
    if resume_from is not None:
        _check_resumed_config(cfg, resume_from)
        log.info("Resuming from %s (latest checkpoint of this run)", resume_from)
        cfg.load_path = resume_from
        cfg.restore_dataloader = True
        cfg.reset_optimizer_state = cfg.reset_trainer_state = False
    _check_load_path_files(cfg)

    # A folder with a checkpoint resumes; one without is a new run, even if an earlier start in it failed or
    # was killed before its first checkpoint: its config.yaml and data-order files are then replaced.
    rerun = resume_from is not None or _decided_on_rank0(lambda: _earlier_start_here(cfg))
    if get_global_rank() == 0 and not cfg.dry_run and resume_from is None:
        save_path = Path(cfg.save_folder) / "config.yaml"
        log.info("Saving config to %s", save_path)
        cfg.save(save_path)
    barrier()

    if cfg.wandb is not None and (get_global_rank() == 0 or not cfg.wandb.rank_zero_only):
        _start_wandb(cfg)
    barrier()

    seed_all(cfg.seed)
    loader_cfg = copy.copy(cfg)
    loader_cfg.save_overwrite = cfg.save_overwrite or rerun  # its work dir exists on a rerun
    train_loader = build_train_dataloader(loader_cfg)
    evaluators = build_evaluators(cfg, device)
    barrier()

    log.info("Building model...")
    olmo_model = build_model(cfg.model)
    log.info("Total number of parameters: %s", f"{olmo_model.num_params():,d}")
    log.info("Number of non-embedding parameters: %s", f"{olmo_model.num_params(include_embedding=False):,d}")
    if cfg.compile is not None:
        if cfg.model.block_group_size != 1:
            raise OLMoConfigurationError("compile is only supported with model.block_group_size=1")
        for block in olmo_model.transformer.blocks:
            block.compile(**cfg.compile.asdict())
    olmo_model.set_activation_checkpointing(cfg.activation_checkpointing)
    dist_model = _wrap(cfg, olmo_model, device)
    log.info("Model:\n%s", dist_model)

    optim = build_optimizer(cfg, dist_model)
    scheduler = build_scheduler(cfg)

    indices_file: TextIO | None = None
    if cfg.save_data_indices:
        indices_path = Path(cfg.save_folder) / f"data-indices/rank{get_global_rank()}.tsv.gz"
        if indices_path.exists() and not cfg.save_overwrite and not rerun:
            raise OLMoConfigurationError(f"{indices_path} already exists, use --save_overwrite to overwrite")
        indices_path.parent.mkdir(exist_ok=True, parents=True)
        indices_file = gzip.open(indices_path, "at")

    trainer = RepoTrainer(
        cfg=cfg,
        epoch=cfg.epoch,
        model=olmo_model,
        dist_model=dist_model,
        optim=optim,
        scheduler=scheduler,
        train_loader=train_loader,
        device=device,
        evaluators=evaluators,
        indices_file=indices_file,
    )

    if not cfg.dry_run and not cfg.no_pre_train_checkpoint and cfg.load_path is None:
        # Save and reload a checkpoint up front, so that a full disk or bad storage fails now.
        checkpoint_type = (
            CheckpointType.sharded
            if cfg.distributed_strategy == DistributedStrategy.fsdp and cfg.save_num_checkpoints_to_keep != 0
            else CheckpointType.unsharded
        )
        log.info("Saving pre-train checkpoint...")
        path, local_cache = trainer.save_checkpoint(checkpoint_type=checkpoint_type)
        log.info("Attempting to load pre-train checkpoint %s...", path)
        trainer.restore_checkpoint(path, checkpoint_type=checkpoint_type, local_cache=local_cache)
        log.info("Checkpoint successfully loaded")

    if cfg.load_path is not None:
        log.info("Loading checkpoint from %s...", cfg.load_path)
        trainer.restore_checkpoint(
            cfg.load_path,
            load_optimizer_state=not cfg.reset_optimizer_state,
            load_trainer_state=not cfg.reset_trainer_state,
            sharded_checkpointer=cfg.load_path_sharded_checkpointer,
        )
        log.info("Checkpoint successfully loaded")
        if cfg.reset_optimizer_state and not cfg.reset_trainer_state:
            trainer.scheduler = BoltOnWarmupScheduler.wrap(
                trainer.scheduler, trainer.global_step, int(trainer.global_step + cfg.scheduler.t_warmup)
            )

    if get_global_rank() == 0:
        _trim_metrics(Path(cfg.save_folder) / METRICS_FILE, trainer.global_step)

    if cfg.force_save_unsharded and cfg.distributed_strategy != DistributedStrategy.ddp:
        log.info("Saving unsharded checkpoint...")
        trainer.save_checkpoint(checkpoint_type=CheckpointType.unsharded)
    return trainer


def _finished(trainer: RepoTrainer) -> bool:
    stop_at = trainer.cfg.stop_at if trainer.cfg.stop_at is not None else trainer.max_steps + 10
    return trainer.global_step > 0 and trainer.global_step >= min(stop_at, trainer.max_steps)


def main(cfg: TrainConfig, device: torch.device) -> bool:
    """Train `cfg` on `device` in the current process group (the body of `scripts/train.py`).

    Returns whether the run stopped on SIGUSR1 before its end (with a checkpoint to resume from).
    """
    preflight(cfg, cuda=device.type == "cuda", world_size=get_world_size())
    with build_trainer(cfg, device) as trainer:
        if cfg.dry_run:
            log.info("Dry run complete")
        elif _finished(trainer):
            log.info("Nothing to do: the run already reached step %d", trainer.global_step)
        else:
            log.info("Starting training...")
            trainer.fit()
            if trainer.stopped_on_signal and not _finished(trainer):
                return True
            log.info("Training complete")
    return False


def _requeue() -> None:
    """Put this SLURM job back in the queue (its next run resumes); outside SLURM, say how to resume."""
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        log.info("Stopped on SIGUSR1: rerun the same command to resume")
        return
    log.info("Stopped on SIGUSR1: requeueing SLURM job %s", job)
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if result.returncode != 0:
        log.error("scontrol requeue %s failed (%s): resubmit the job to resume", job, result.stderr.strip())


def train(config_path: str, overrides: Sequence[str]) -> None:
    """`scripts/train.py CONFIG [--key=value ...]`: load the config with CLI overrides and train.

    SIGUSR1 at any time makes the run stop with a checkpoint after the current step; under SLURM rank 0 then
    requeues the job, once every rank is done.
    """
    signal.signal(signal.SIGUSR1, lambda signum, frame: STOP_REQUESTED.set())
    patch_torch_for_olmo()
    device = init_distributed()
    prepare_cli_environment()
    add_cached_path_clients()
    cfg = RepoTrainConfig.load(config_path, [clean_opt(s) for s in overrides])
    rank = get_global_rank()
    try:
        stopped = main(cfg, device)
        barrier()
    finally:
        dist.destroy_process_group()
    if stopped and rank == 0:
        _requeue()
