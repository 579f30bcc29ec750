"""The callbacks this project adds to OLMo-core's `Trainer` (`train.build_trainer`): the run's metrics file
(`MetricsFileCallback`), the index blend and the positions' statistics (`PositionsCallback`), and a stop on
SIGUSR1 (`SignalStopCallback`)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import torch
from olmo_core.train.callbacks import Callback

from ..metrics import append_metrics, trim_metrics
from ..modes import index_blend
from ..paths import is_url
from ..positions import position_stats
from ..rope import set_index_blend

__all__ = ["MetricsFileCallback", "PositionsCallback", "SignalStopCallback"]


@dataclass
class MetricsFileCallback(Callback):
    """Rank 0 writes every logged step to `save_folder/metrics.jsonl` ({"step": N, name: value, ...}, full
    precision; one record per step, as the ai2-olmo side: `olmo_repo.metrics`). For a remote save folder the file
    stays local, named after it under the working directory: `s3://bucket/runs/a` ->
    `work_dir/metrics/s3/bucket/runs/a/metrics.jsonl` (OLMo-core's default working directory is shared by every
    remote run). On a resume the records after the checkpoint's step are dropped first: each step appears once,
    from the run that went on from it."""

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
