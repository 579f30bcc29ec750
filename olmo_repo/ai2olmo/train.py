"""The run: the process group, W&B, model wrap, `build_trainer` (everything up to `fit()`), `run` (preflight,
build, fit) and `train` (what `scripts/train.py` calls: config, signals, SLURM requeue): OLMo's own Trainer,
data loader and checkpointer driving a RePo model, on GPU or CPU.

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
import gzip
import logging
import os
import shutil
import signal
import socket
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
import wandb
from olmo.config import (
    CheckpointType,
    DistributedStrategy,
    TrainConfig,
)
from olmo.data import build_train_dataloader
from olmo.eval import build_evaluators
from olmo.exceptions import OLMoConfigurationError
from olmo.model import OLMo
from olmo.optim import BoltOnWarmupScheduler, build_optimizer, build_scheduler
from olmo.torch_util import (
    barrier,
    get_global_rank,
    get_local_rank,
    get_world_size,
    seed_all,
)
from olmo.util import (
    add_cached_path_clients,
    clean_opt,
    is_url,
    log_extra_field,
    prepare_cli_environment,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.nn.parallel import DistributedDataParallel as DDP

from ..metrics import METRICS_FILE, trim_metrics
from ..modes import is_f_phi_param
from ..ownership import check_free, die_with_launcher, held
from ..slurm import requeue
from ..upstream import wandb as wandb_upstream
from ..upstream.olmo import make_state_dict_compatible
from ..upstream.torch import patch_torch_for_olmo
from .config import RepoTrainConfig
from .hf import recorded_stock
from .niah import check_entry, check_prompts_fit
from .preflight import HYBRID_STRATEGIES, check_load_path_files, hybrid_replicas, preflight, removed_if_failed
from .registry import build_model
from .run_folder import (
    check_optimizer_groups,
    check_resumed_config,
    decided_on_rank0,
    earlier_start_here,
    latest_checkpoint,
    trim_data_indices,
)
from .stage1 import check_stage1_state_dict, meta_model
from .trainer import STOP_REQUESTED, RepoTrainer

log = logging.getLogger(__name__)


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


def _start_wandb(cfg: TrainConfig) -> None:
    """`wandb.init` for the run, bounded by W&B's own `WANDB_INIT_TIMEOUT` (90 s by default): without network
    it would wait silently and then fail with a traceback; here the wait is announced and a failure is one
    line saying how to train without reaching W&B."""
    assert cfg.wandb is not None
    wandb_dir = Path(cfg.save_folder) / "wandb"
    created = not wandb_dir.exists()
    wandb_dir.mkdir(parents=True, exist_ok=True)
    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", 90))
    mode = os.environ.get("WANDB_MODE", "online")
    log.info("Starting W&B (%s; gives up after %.0f s, WANDB_INIT_TIMEOUT)", mode, timeout)
    try:
        wandb_upstream.init_keeping_hooks(
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
        if created:  # a failed start leaves no wandb/ behind
            shutil.rmtree(wandb_dir, ignore_errors=True)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise OLMoConfigurationError(
            f"W&B did not start ({reason}): on a machine without network set WANDB_MODE=offline (upload later "
            "with `wandb sync`), or pass --wandb=null to train without W&B"
        ) from None


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
    if cfg.fsdp.sharding_strategy in HYBRID_STRATEGIES:  # replicas checked by preflight
        replicas = hybrid_replicas(cfg, get_world_size())
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


def _derive_settings(cfg: TrainConfig) -> None:
    """The settings OLMo's own script derives from the config before anything is built."""
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


def _point_at_latest_checkpoint(cfg: TrainConfig) -> str | None:
    """Point `cfg` at the latest checkpoint of this run (returned), checked against the config, if there is
    one; then check that the files the load will read are intact, and that its optimizer state has this run's
    param groups."""
    resume_from = latest_checkpoint(cfg)
    if (
        cfg.hf_config is None
    ):  # the stock HF model's config, carried into this run's checkpoints (convert_to_hf)
        cfg.hf_config = recorded_stock(resume_from or cfg.load_path)
    if resume_from is not None:
        check_resumed_config(cfg, resume_from)
        cfg.load_path = resume_from
        cfg.restore_dataloader = True
        cfg.reset_optimizer_state = cfg.reset_trainer_state = False
    check_load_path_files(cfg)
    check_optimizer_groups(cfg)
    return resume_from


def _resume_or_start(cfg: TrainConfig) -> bool:
    """Point `cfg` at the latest checkpoint of this run, if there is one, or save its config.yaml for a new
    run. Returns whether this is a rerun in the folder (a resume, or a new start after one that failed or was
    killed before its first checkpoint: its config.yaml and data-order files are then replaced)."""
    resume_from = _point_at_latest_checkpoint(cfg)
    if resume_from is not None:
        log.info("Resuming from %s (latest checkpoint of this run)", resume_from)
    rerun = resume_from is not None or decided_on_rank0(lambda: earlier_start_here(cfg))
    if get_global_rank() == 0 and not cfg.dry_run and resume_from is None:
        save_path = Path(cfg.save_folder) / "config.yaml"
        log.info("Saving config to %s", save_path)
        save_path.parent.mkdir(parents=True, exist_ok=True)  # preflight checks it, without creating it
        cfg.save(save_path)
    barrier()
    return rerun


def _build_model(cfg: TrainConfig, device: torch.device) -> tuple[OLMo, DDP | FSDP]:
    """The model and its DDP/FSDP wrap, compiled and checkpointed as the config says."""
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
    if getattr(cfg, "f_phi", None) is not None and cfg.f_phi.only:
        _train_f_phi_only(olmo_model)
    dist_model = _wrap(cfg, olmo_model, device)
    log.info("Model:\n%s", dist_model)
    return olmo_model, dist_model


def _train_f_phi_only(model: OLMo) -> None:
    """`f_phi.only`: every weight but f_phi's frozen, before the wrap (DDP and FSDP then leave them out of
    gradient synchronisation) and before the optimizer is built (OLMo's param groups take only what
    requires a gradient)."""
    for name, param in model.named_parameters():
        param.requires_grad_(is_f_phi_param(name))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("f_phi.only: f_phi's %s weights trained, every other weight frozen", f"{trained:,d}")


def _data_indices(cfg: TrainConfig, rerun: bool) -> Path | None:
    """This rank's data-indices file, when the config saves them; one that a new run did not write is refused."""
    if not cfg.save_data_indices:
        return None
    path = Path(cfg.save_folder) / f"data-indices/rank{get_global_rank()}.tsv.gz"
    if path.exists() and not cfg.save_overwrite and not rerun:
        raise OLMoConfigurationError(f"{path} already exists, use --save_overwrite to overwrite")
    return path


def _open_data_indices(path: Path, step: int) -> TextIO:
    """The data-indices file, to append the steps after `step` to (the records of later steps, from before a
    kill, are dropped first: `trim_data_indices`)."""
    trim_data_indices(path, step)
    path.parent.mkdir(exist_ok=True, parents=True)
    return gzip.open(path, "at")


def _load_state(trainer: RepoTrainer, cfg: TrainConfig) -> None:
    """A new run saves and reloads a checkpoint up front (so that a full disk or bad storage fails now); a
    resumed or initialised one loads `load_path`."""
    if not cfg.dry_run and not cfg.no_pre_train_checkpoint and cfg.load_path is None:
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


def build_trainer(cfg: TrainConfig, device: torch.device) -> RepoTrainer:
    """Everything up to `fit()`: config handling, W&B, data, model, optimizer, checkpoint loading.

    Expects `preflight(cfg, ...)` to have run and the process group to be up.
    """
    log_extra_field("run_name", cfg.run_name)
    _derive_settings(cfg)
    # Evaluators first: a bad entry is refused before the config is saved, W&B starts and the data loader and
    # model are built (olmo_repo.ai2olmo.niah builds its NIAH prompts here).
    evaluators = build_evaluators(cfg, device)
    rerun = _resume_or_start(cfg)

    if cfg.wandb is not None and (get_global_rank() == 0 or not cfg.wandb.rank_zero_only):
        _start_wandb(cfg)
    barrier()

    seed_all(cfg.seed)
    loader_cfg = copy.copy(cfg)
    loader_cfg.save_overwrite = cfg.save_overwrite or rerun  # its work dir exists on a rerun
    train_loader = build_train_dataloader(loader_cfg)
    barrier()

    olmo_model, dist_model = _build_model(cfg, device)
    indices = _data_indices(cfg, rerun)
    trainer = RepoTrainer(
        cfg=cfg,
        epoch=cfg.epoch,
        model=olmo_model,
        dist_model=dist_model,
        optim=build_optimizer(cfg, dist_model),
        scheduler=build_scheduler(cfg),
        train_loader=train_loader,
        device=device,
        evaluators=evaluators,
    )
    _load_state(trainer, cfg)
    if get_global_rank() == 0:
        trim_metrics(Path(cfg.save_folder) / METRICS_FILE, trainer.global_step)
    if indices is not None and not _finished(trainer):  # a finished run records nothing, and appends nothing
        trainer.indices_file = _open_data_indices(indices, trainer.global_step)
    if cfg.force_save_unsharded and cfg.distributed_strategy != DistributedStrategy.ddp:
        log.info("Saving unsharded checkpoint...")
        trainer.save_checkpoint(checkpoint_type=CheckpointType.unsharded)
    return trainer


def _finished(trainer: RepoTrainer) -> bool:
    stop_at = trainer.cfg.stop_at if trainer.cfg.stop_at is not None else trainer.max_steps + 10
    return trainer.global_step > 0 and trainer.global_step >= min(stop_at, trainer.max_steps)


def run(cfg: TrainConfig, device: torch.device) -> bool:
    """Train `cfg` on `device` in the current process group (the body of `scripts/train.py`).

    Returns whether the run stopped on SIGUSR1 before its end (with a checkpoint to resume from).
    """
    preflight(cfg, cuda=device.type == "cuda", world_size=get_world_size())
    with ExitStack() as owned:
        # A start that fails before its first checkpoint leaves no save_folder behind (if it created it).
        with removed_if_failed(cfg.save_folder):
            owned.enter_context(held(cfg.save_folder, "save_folder", get_global_rank()))  # the run's folder
            trainer = build_trainer(cfg, device)
        with trainer:
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


def check(config_path: str, overrides: Sequence[str], *, world_size: int, local_world_size: int) -> None:
    """Everything a rank checks before its model is built, once, for a run of `world_size` ranks: the config,
    the preflight, the evaluators' entries, the run folder (a resume's checkpoint and config), and how a local
    unsharded `load_path`'s model.pt fits the model (the stage-1 fit rule, from its keys and shapes:
    memory-mapped, nothing read).
    What `scripts/train.py --nproc-per-node` runs before it starts the workers, so that a bad input is one line
    instead of one per rank and torchrun's traceback. Starts no process group; may move a corrupt newest
    checkpoint aside, as rank 0 would."""
    patch_torch_for_olmo()
    cfg = RepoTrainConfig.load(config_path, [clean_opt(s) for s in overrides])
    preflight(cfg, cuda=torch.cuda.is_available(), world_size=world_size, local_world_size=local_world_size)
    check_free(cfg.save_folder, "save_folder")  # before anything below touches the folder
    for evaluator in cfg.evaluators:  # what each rank's evaluator build would refuse: the entries first
        check_entry(cfg, evaluator)
    for evaluator in cfg.evaluators:  # then one prompt of each built with the run's tokenizer
        check_prompts_fit(cfg, evaluator)
    _point_at_latest_checkpoint(cfg)
    earlier_start_here(cfg)
    model_pt = Path(cfg.load_path or "", "model.pt")
    if cfg.load_path is not None and not is_url(cfg.load_path) and model_pt.is_file():
        state = torch.load(model_pt, map_location="cpu", mmap=True, weights_only=True)
        state = make_state_dict_compatible(meta_model(cfg.model), state)
        check_stage1_state_dict(state, cfg.model, f"load_path={cfg.load_path}")


def train(config_path: str, overrides: Sequence[str]) -> None:
    """`scripts/train.py CONFIG [--key=value ...]`: load the config with CLI overrides and train.

    SIGUSR1 at any time makes the run stop with a checkpoint after the current step; under SLURM rank 0 then
    requeues the job, once every rank is done.
    """
    die_with_launcher()
    signal.signal(signal.SIGUSR1, lambda signum, frame: STOP_REQUESTED.set())
    patch_torch_for_olmo()
    device = init_distributed()
    prepare_cli_environment()
    add_cached_path_clients()
    cfg = RepoTrainConfig.load(config_path, [clean_opt(s) for s in overrides])
    rank = get_global_rank()
    try:
        stopped = run(cfg, device)
        barrier()
    finally:
        dist.destroy_process_group()
    if stopped and rank == 0:
        requeue()
