"""torch 2.13, olmo_core 0.1.0 and numpy 1.26 as ai2-olmo 0.6.0 assumes them: `patch_torch_for_olmo`.

ai2-olmo 0.6.0 was written for CUDA and torch < 2.6; on current torch, on CPU, and in its olmo_core sharded
checkpointer some of its assumptions break. The function below fixes them by patching torch's CUDA RNG
accessors (CPU only), FSDP's `set_state_dict_type` (CPU only) and olmo_core's `init_optimizer_state`, and by
allowing numpy's private `_reconstruct` (with the types `train.pt` holds) in torch's safe loader. It patches
process-wide state, so only entry points call it: `scripts/train.py` (through `olmo_repo.ai2olmo.train`) and the
unshard command; tests call it in their process-group fixture.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import olmo_core.distributed.checkpoint as olmo_core_checkpoint
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import (
    OptimStateDictConfig,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)

VERSIONS = {"torch": "2.13.0", "olmo_core": "0.1.0", "numpy": "1.26.4"}
CANARIES = {
    "olmo_repo.upstream.torch.STOCK_SET_STATE_DICT_TYPE": "f8908b1652e98c04",  # before the patch
    "olmo_repo.upstream.torch.STOCK_INIT_OPTIMIZER_STATE": "6ffe7ee17420c2e6",  # before the patch
    "olmo.train.Trainer.trainer_state_dict": "ccda31d2a5de2ac8",  # torch.cuda.get_rng_state() unguarded
    "olmo.train.Trainer.load_trainer_state_dict": "0117753eb6151990",
    "numpy.core.multiarray._reconstruct": None,  # private, allowed in the safe loader: must exist
}

STOCK_SET_STATE_DICT_TYPE = FSDP.set_state_dict_type


def _set_state_dict_type_without_offload(
    module: torch.nn.Module,
    state_dict_type: StateDictType,
    state_dict_config: StateDictConfig | None = None,
    optim_state_dict_config: OptimStateDictConfig | None = None,
) -> StateDictSettings:
    """`FSDP.set_state_dict_type` with `offload_to_cpu=False` in both configs (see `patch_torch_for_olmo`)."""
    return STOCK_SET_STATE_DICT_TYPE(
        module,
        state_dict_type,
        state_dict_config and dataclasses.replace(state_dict_config, offload_to_cpu=False),
        optim_state_dict_config and dataclasses.replace(optim_state_dict_config, offload_to_cpu=False),
    )


STOCK_INIT_OPTIMIZER_STATE = olmo_core_checkpoint.init_optimizer_state


def _init_optimizer_state_inertly(optim: torch.optim.Optimizer) -> None:
    """olmo_core's `init_optimizer_state` leaving parameters and step counts as they are (see
    `patch_torch_for_olmo`): its zero-gradient step runs at lr = 0 and weight decay 0 (parameters unchanged
    bit for bit, moments stay 0), then the step counters it advanced go back to 0."""
    if optim.state:
        return
    settings = [(group["lr"], group["weight_decay"]) for group in optim.param_groups]
    for group in optim.param_groups:
        group["lr"] = group["weight_decay"] = 0.0
    STOCK_INIT_OPTIMIZER_STATE(optim)
    for group, (lr, weight_decay) in zip(optim.param_groups, settings):
        group["lr"], group["weight_decay"] = lr, weight_decay
    for state in optim.state.values():
        if "step" in state:
            state["step"].zero_()


TRAIN_STATE_TYPES = [
    pathlib.PosixPath,
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    np.core.multiarray._reconstruct,  # type: ignore[attr-defined]
]
"""What OLMo's `train.pt` holds beyond tensors and plain values: checkpoint paths and numpy's RNG state."""


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
    torch.serialization.add_safe_globals(TRAIN_STATE_TYPES)


def read_train_state(path: str | pathlib.Path) -> dict:
    """OLMo's `train.pt` (the trainer state) through torch's safe loader, allowing `TRAIN_STATE_TYPES` for
    this read only (where `patch_torch_for_olmo`, which allows them process-wide, has not run). Only the types
    not allowed already are added: torch's context removes what it added on exit, which would otherwise undo
    the process-wide patch, and OLMo's next restore of a train.pt would be refused."""
    allowed = torch.serialization.get_safe_globals()
    with torch.serialization.safe_globals([t for t in TRAIN_STATE_TYPES if t not in allowed]):
        return torch.load(path, map_location="cpu", weights_only=True)
