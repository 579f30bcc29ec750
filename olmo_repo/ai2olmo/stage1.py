"""Initialising a RePo run from a stage-1 checkpoint (OLMo-2 before RePo): `RepoCheckpointer`.

A stage-1 checkpoint has every tensor of a RePo model except the RePo weights (f_phi's `gate_map`,
`content_map`, `final_map` of the RePo layers). Stock `FullCheckpointer` loads strictly and fails on it;
`RepoCheckpointer` accepts exactly that gap and nothing else:

- every base tensor loads bit-exact, the RePo weights keep their fresh init;
- the optimizer continues the stage-1 AdamW state (exp_avg, exp_avg_sq, step) of every base parameter, and
  the RePo parameters start with no state (AdamW initialises it at their first step, as for a new run);
- any other checkpoint fails with an error naming the keys: the one stage-1 fit rule of both trainers
  (`olmo_repo.fit`), so that OLMo-core's side answers the same input the same way.

A complete checkpoint (resuming a RePo run, or a stock model into a stock config) takes the stock path.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
from olmo.aliases import PathOrStr
from olmo.checkpoint import FullCheckpointer, load_fsdp_optim_state, load_state_dict
from olmo.config import ModelConfig
from olmo.exceptions import OLMoCheckpointError
from olmo.model import OLMo
from olmo.optim import Optimizer
from olmo.torch_util import barrier
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.nn.parallel import DistributedDataParallel as DDP

from ..fit import f_phi_layer, fit_stage1, listed
from ..upstream.olmo import make_state_dict_compatible
from .registry import build_model

__all__ = [
    "RepoCheckpointer",
    "check_stage1_state_dict",
    "clean_param_name",
    "continue_optimizer_state",
    "meta_model",
    "repo_param_names",
]

log = logging.getLogger(__name__)


def meta_model(config: ModelConfig) -> OLMo:
    """The model of `config` on the meta device: names and shapes, no memory."""
    return build_model(dataclasses.replace(config, init_device="meta"))


def repo_param_names(config: ModelConfig) -> set[str]:
    """State-dict names of the RePo weights (gate_map/content_map/final_map of every RePo layer), by the fit
    rule's reading of a key (`olmo_repo.fit.f_phi_layer`)."""
    return {k for k in meta_model(config).state_dict() if f_phi_layer(k) is not None}


def clean_param_name(name: str) -> str:
    """A parameter name without the FSDP wrapper infixes and the DDP prefix."""
    return name.replace("_fsdp_wrapped_module.", "").removeprefix("module.")


def check_stage1_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: ModelConfig, source: str = "the checkpoint"
) -> set[str]:
    """Check a checkpoint's model state dict against the model of `config` by the stage-1 fit rule
    (`olmo_repo.fit.fit_stage1`, which OLMo-core's side calls too).

    Returns the keys the checkpoint lacks: empty for a complete checkpoint, or exactly the RePo weights for a
    stage-1 checkpoint. Anything else raises `CheckpointFitError` naming the keys (or the layers).
    """
    model = {k: tuple(v.shape) for k, v in meta_model(config).state_dict().items()}
    return fit_stage1(model, {k: tuple(v.shape) for k, v in state_dict.items()}, source)


def _state_by_name(optim_state: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """{clean parameter name: state} and the parameter names of a saved optimizer, in either format.

    DDP checkpoints are int-keyed with `param_names` in each group; FSDP full checkpoints are keyed by name.
    """
    by_name: dict[str, Any] = {}
    names: set[str] = set()
    for group in optim_state["param_groups"]:
        ids, group_names = group["params"], group.get("param_names", group["params"])
        for pid, name in zip(ids, group_names):
            if not isinstance(name, str):
                raise OLMoCheckpointError(
                    "optim.pt has no parameter names; cannot match its state to parameters"
                )
            names.add(clean_param_name(name))
            if pid in optim_state["state"]:
                by_name[clean_param_name(name)] = optim_state["state"][pid]
    return by_name, names


def continue_optimizer_state(
    stage1_optim_state: dict[str, Any],
    optim: Optimizer,
    new_params: set[str],
    *,
    by_name: bool,
    frozen: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
    """Optimizer-state surgery: the stage-1 state of every base parameter, no state for `new_params`; the
    stage-1 state of `frozen` parameters (not trained here: `f_phi.only`) is left out.

    Returns a state dict for `optim`: int-keyed for `optim.load_state_dict` (DDP), or keyed by parameter
    name for `FSDP.optim_state_dict_to_load` (`by_name=True`). Param-group hyperparameters are the current
    optimizer's (the config's); the trainer resets lr and weight decay from the config anyway.
    """
    stage1, stage1_names = _state_by_name(stage1_optim_state)
    stage1_names -= frozen
    current = optim.state_dict()
    current_names = {clean_param_name(n) for g in current["param_groups"] for n in g["param_names"]}
    base = current_names - new_params
    if stage1_names != base:
        problems = []
        if base - stage1_names:
            problems.append(f"no optimizer state for: {listed(base - stage1_names)}")
        if stage1_names - base:
            problems.append(f"state for unknown parameters: {listed(stage1_names - base)}")
        raise OLMoCheckpointError(
            "optim.pt does not fit this model: " + "; ".join(problems) + ". Set reset_optimizer_state=true "
            "to start the optimizer fresh."
        )
    state: dict[Any, Any] = {}
    groups = []
    for group in current["param_groups"]:
        names = [clean_param_name(n) for n in group["param_names"]]
        keys = names if by_name else group["params"]
        state.update({key: stage1[name] for key, name in zip(keys, names) if name in stage1})
        groups.append({**group, "params": keys, "param_names": names} if by_name else group)
    log.info(
        "Optimizer surgery: stage-1 state for %d base parameters, fresh state for %d RePo parameters",
        len(base),
        len(new_params),
    )
    return {"state": state, "param_groups": groups}


def _initial_state_for(optim: Optimizer, names: set[str]) -> None:
    """Give the parameters `names` the optimizer state their first step would create (step 0, zero moments).

    FSDP gathers an optimizer state dict (any checkpoint) only if every parameter of an FSDP unit has a state
    or none has; right after the surgery the RePo weights have none. Same arithmetic as no state: AdamW
    starts from exactly these values. Parameters with no local shard get none, as in a step.
    """
    template = next((state for state in optim.state.values() if state), None)  # a base parameter's state
    if template is None:  # stage 1 saved before its first step: no parameter has a state
        return
    for group in optim.param_groups:
        for name, param in zip(group["param_names"], group["params"]):
            if clean_param_name(name) in names and param.numel() > 0:
                optim.state[param] = {
                    key: torch.zeros_like(param if value.dim() else value)
                    for key, value in template.items()
                    if key != "grad_norm_exp_avg"  # OLMo's clipping statistic, created after the first step
                }


class RepoCheckpointer(FullCheckpointer):
    """`FullCheckpointer` that also initialises a RePo model from a stage-1 checkpoint.

    Delta: `restore_checkpoint` first checks model.pt against the config (`check_stage1_state_dict`). A
    complete checkpoint then takes the stock path unchanged. A stage-1 checkpoint loads its base tensors
    (DDP: the module; FSDP: a full state dict on every rank), continues the optimizer state by surgery (FSDP:
    the RePo weights get AdamW's initial state explicitly, see `_initial_state_for`), and reads train.pt; a
    checkpoint without optim.pt/train.pt (weights converted from elsewhere) needs
    `reset_optimizer_state`/`reset_trainer_state`, and the error says so.
    """

    def restore_checkpoint(
        self,
        load_path: PathOrStr,
        dist_model: nn.Module,
        optim: Optimizer,
        *,
        local_cache: PathOrStr | None = None,
        load_optimizer_state: bool = True,
    ) -> dict[str, Any]:
        state_dict = load_state_dict(load_path, "model.pt", local_cache=local_cache, map_location="cpu")
        state_dict = make_state_dict_compatible(meta_model(self.cfg.model), state_dict)
        new_params = check_stage1_state_dict(state_dict, self.cfg.model, f"load_path={load_path}")
        if not new_params:
            del state_dict
            return super().restore_checkpoint(
                load_path,
                dist_model,
                optim,
                local_cache=local_cache,
                load_optimizer_state=load_optimizer_state,
            )

        log.info(
            "Initialising from stage-1 checkpoint %s: %d RePo weights keep their init",
            load_path,
            len(new_params),
        )
        is_fsdp = isinstance(dist_model, FSDP)
        if is_fsdp and load_optimizer_state and not self.cfg.fsdp.use_orig_params:
            raise OLMoCheckpointError(
                "continuing the stage-1 optimizer state needs per-parameter state: set fsdp.use_orig_params=true "
                "(the default), or reset_optimizer_state=true"
            )
        with torch.no_grad():
            if is_fsdp:
                with FSDP.state_dict_type(
                    dist_model,
                    StateDictType.FULL_STATE_DICT,
                    FullStateDictConfig(rank0_only=False, offload_to_cpu=True),
                ):
                    result = dist_model.load_state_dict(state_dict, strict=False)
            elif isinstance(dist_model, DDP):
                result = dist_model.module.load_state_dict(state_dict, strict=False)
            else:
                raise NotImplementedError("RepoCheckpointer supports the DDP and FSDP strategies")
        loaded_missing = {clean_param_name(k) for k in result.missing_keys}
        if loaded_missing != new_params or result.unexpected_keys:
            raise OLMoCheckpointError(
                f"stage-1 load left unexpected gaps: {listed(loaded_missing ^ new_params)}"
            )
        del state_dict

        if load_optimizer_state:
            _continue_optimizer(load_path, dist_model, optim, new_params, local_cache)
        barrier()

        try:
            trainer_state = load_state_dict(load_path, "train.pt", local_cache=local_cache)
        except FileNotFoundError:
            if not self.cfg.reset_trainer_state:
                raise OLMoCheckpointError(
                    f"{load_path} has no train.pt: set reset_trainer_state=true to start the trainer state fresh"
                ) from None
            trainer_state = {}
        barrier()
        return trainer_state


def _continue_optimizer(
    load_path: PathOrStr,
    dist_model: nn.Module,
    optim: Optimizer,
    new_params: set[str],
    local_cache: PathOrStr | None,
) -> None:
    """Load the stage-1 optimizer state into `optim` by surgery (`continue_optimizer_state`): the state of the
    base parameters it trains, none for `new_params` (FSDP: AdamW's initial state, `_initial_state_for`)."""
    try:
        stage1_optim = load_state_dict(load_path, "optim.pt", local_cache=local_cache, map_location="cpu")
    except FileNotFoundError:
        raise OLMoCheckpointError(
            f"{load_path} has no optim.pt: set reset_optimizer_state=true to start the optimizer fresh"
        ) from None
    is_fsdp = isinstance(dist_model, FSDP)
    frozen = {clean_param_name(n) for n, p in dist_model.named_parameters() if not p.requires_grad}
    optim_state = continue_optimizer_state(stage1_optim, optim, new_params, by_name=is_fsdp, frozen=frozen)
    del stage1_optim
    if is_fsdp:
        load_fsdp_optim_state(dist_model, optim, optim_state)
        _initial_state_for(optim, new_params)
    else:
        optim.load_state_dict(optim_state)
