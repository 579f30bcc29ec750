"""`RepoTrainer`: OLMo's `Trainer` with the deltas of this project (see the class docstring)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import wandb
from olmo.aliases import PathOrStr
from olmo.config import (
    CheckpointType,
)
from olmo.exceptions import OLMoConfigurationError
from olmo.torch_util import (
    barrier,
    get_global_rank,
    synchronize_flag,
)
from olmo.train import Trainer

from ..metrics import METRICS_FILE, append_metrics
from ..modes import POSITIONS_METRIC, FPhiTraining, index_blend, is_f_phi_param
from ..positions import position_stats
from ..rope import repo_layers, set_index_blend
from ..upstream import wandb as wandb_upstream
from ..upstream.olmo import hold_group_settings, scheduled_lr, split_param_group
from .config import f_phi_has_own_group
from .preflight import is_unsharded
from .stage1 import RepoCheckpointer

log = logging.getLogger(__name__)


_POSITIONS = POSITIONS_METRIC.split("{")[0]  # what the console leaves out

STOP_REQUESTED = threading.Event()
"""Set by SIGUSR1 (handler installed by `train`): save a checkpoint after the current step and stop."""

F_PHI_GROUP = "lr_multiplier"
"""The key of f_phi's own param group (its value: `f_phi.lr_multiplier`); stock groups have none."""


class RepoTrainer(Trainer):
    """OLMo's `Trainer` with these deltas:

    - unsharded checkpoints are restored by `RepoCheckpointer` (stage-1 init; complete checkpoints as stock);
    - a `load_path` without `-unsharded` in its name that holds model.pt is read as unsharded;
    - the index blend (`model.pe_blend_init`, `model.pe_blend_steps`): before every step's forward, before
      every evaluation and after every restore, every RePo layer gets p = `modes.index_blend(init, steps,
      steps completed)`, so a resumed run continues the schedule where it stopped;
    - f_phi's own learning rate and weight decay (`f_phi.lr_multiplier`, `f_phi.weight_decay`, when not the
      base's): its parameters in param groups of their own, whose lr is the schedule's times the multiplier
      and whose weight decay is f_phi's, before every step and after every restore (OLMo's Trainer sets one
      lr for every group on both, and resets weight decay on restore: `olmo_repo.upstream.olmo`);
    - at log steps, the statistics of the predicted positions of every RePo layer (first micro-batch, this
      rank; `positions.position_stats`: `train/positions/layer{i}/{min,max,std,p05,p95,rank_corr}`, and the
      blend's p as `train/positions/index_blend` while it is on) join the metrics (W&B, metrics.jsonl; not
      the console);
    - rank 0 adds every console-logged metrics dict to `save_folder/metrics.jsonl` at full precision, one
      record per step (`olmo_repo.metrics.append_metrics`);
    - after every step the ranks agree whether rank 0 got SIGUSR1 (`STOP_REQUESTED`); if so, OLMo's cancel
      path ends the run at this step, `stopped_on_signal` is set, and `fit` makes sure a checkpoint of this
      step exists (OLMo's path writes none under DDP without `save_interval_unsharded`);
    - `eval_on_load` also evaluates a checkpoint loaded at step 0 (stock: only past step 0), before training;
    - `close` finishes W&B without the `quiet` argument that current wandb lacks.
    """

    stopped_on_signal: bool = False
    _stop_interval: int | None = None  # the configured canceled_check_interval while a stop is pending

    def __post_init__(self) -> None:
        super().__post_init__()
        f_phi = self.f_phi
        if f_phi_has_own_group(f_phi):
            groups = split_param_group(self.optim, is_f_phi_param, {F_PHI_GROUP: f_phi.lr_multiplier})
            if not groups and repo_layers(self.model):  # preflight refuses what leads here
                raise OLMoConfigurationError(
                    "f_phi's own learning rate or weight decay needs its parameters apart in the optimizer: "
                    "FSDP flattens them with the others unless fsdp.use_orig_params=true"
                )
            for group in groups:
                group.update(self._f_phi_group_settings(group) or {})
            hold_group_settings(self.optim, self._f_phi_group_settings)
        self._set_index_blend(self.global_step)

    @property
    def f_phi(self) -> FPhiTraining:
        """The run's `f_phi` section (a stock `TrainConfig` has none: the defaults)."""
        return getattr(self.cfg, "f_phi", None) or FPhiTraining()

    def _f_phi_group_settings(self, group: dict[str, Any]) -> dict[str, Any] | None:
        """What f_phi's group takes from the config now (None for any other group): the schedule's lr times
        the multiplier, and f_phi's weight decay if it has its own."""
        if F_PHI_GROUP not in group:
            return None
        f_phi = self.f_phi
        settings = {"lr": scheduled_lr(self) * f_phi.lr_multiplier, F_PHI_GROUP: f_phi.lr_multiplier}
        if f_phi.weight_decay is not None:
            settings["weight_decay"] = f_phi.weight_decay
        return settings

    def _set_index_blend(self, steps_completed: int) -> None:
        """p of the index blend after `steps_completed` optimizer steps, on every RePo layer."""
        model = self.cfg.model
        blend = index_blend(
            getattr(model, "pe_blend_init", 0.0), getattr(model, "pe_blend_steps", 0), steps_completed
        )
        set_index_blend(self.model, blend)

    def restore_checkpoint(
        self, load_path: PathOrStr, *, checkpoint_type: CheckpointType | None = None, **kwargs: Any
    ) -> None:
        if checkpoint_type is None and is_unsharded(load_path):
            checkpoint_type = CheckpointType.unsharded
        super().restore_checkpoint(load_path, checkpoint_type=checkpoint_type, **kwargs)
        # OLMo's restore set every group's lr, and the weight decay of those that have one, from the config;
        # the optimizer state loaded f_phi's group as the checkpoint saved it: the config's values apply.
        for group in self.optim.param_groups:
            group.update(self._f_phi_group_settings(group) or {})
        self._set_index_blend(self.global_step)

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
        self._set_index_blend(self.global_step - 1)  # `fit` counts the step before it runs it
        metrics = self._train_step_with_positions(batch, reduce_global_loss)
        # OLMo's loop asks `check_if_cancelled` only every `canceled_check_interval` steps; a stop must come
        # within one step, so on a stop request the loop is made to ask at this very step.
        if synchronize_flag(STOP_REQUESTED.is_set(), self.device):
            self._stop_interval = self.cfg.canceled_check_interval
            self.cfg.canceled_check_interval = 1
        return metrics

    def fit(self) -> None:
        # Stock `eval_on_load` evaluates a loaded checkpoint only past step 0; a checkpoint converted from a
        # pre-trained model (train.pt at step 0) is where a continual pre-training starts, and its score is the
        # baseline of every later one.
        if self.cfg.load_path is not None and self.global_step == 0 and self.cfg.eval_on_load:
            metrics = self.eval()
            if wandb.run is not None:
                wandb.log(metrics, step=0)
        super().fit()
        if self.stopped_on_signal and self.global_step not in (
            self.last_sharded_checkpoint_step,
            self.last_unsharded_checkpoint_step,
        ):
            log.info("Saving unsharded checkpoint...")
            path, _ = self.save_checkpoint(CheckpointType.unsharded)
            log.info("Unsharded checkpoint saved to %s", path)

    def eval(self) -> dict[str, Any]:
        self._set_index_blend(self.global_step)  # the model as trained so far
        return super().eval()

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
        with position_stats(self.model) as stats:
            metrics = super().train_step(batch, reduce_global_loss)
        metrics.update(stats)
        return metrics

    def close(self, exit_code: int = 0) -> None:
        wandb_upstream.finish(exit_code)  # before stock close, whose wandb.finish(quiet=True) would fail
        super().close(exit_code)

    def log_metrics_to_console(self, prefix: str, metrics: dict[str, float]) -> None:
        # Three position numbers per RePo layer (33 lines for the 1B) would drown the console: W&B and
        # metrics.jsonl have them.
        super().log_metrics_to_console(
            prefix, {k: v for k, v in metrics.items() if not k.startswith(_POSITIONS)}
        )
        if get_global_rank() == 0:
            append_metrics(Path(self.cfg.save_folder) / METRICS_FILE, self.global_step, metrics)
