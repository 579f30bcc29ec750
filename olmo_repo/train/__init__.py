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

Modules: `run` (process group, wrap, `build_trainer`, `run`, `train`), `trainer` (`RepoTrainer`), `inloop`
(in-loop NIAH as an OLMo evaluator), `preflight`
(checks before anything is written), `run_folder` (resume, config changes, metrics.jsonl), `stage1`
(`RepoCheckpointer`: stage-1 initialisation), `unshard` (sharded -> unsharded checkpoints). Fixes to
ai2-olmo 0.6.0 on current torch are `olmo_repo.upstream.torch`.
"""

from .preflight import preflight
from .run import build_trainer, init_distributed, run, train
from .trainer import RepoTrainer

__all__ = ["RepoTrainer", "build_trainer", "init_distributed", "preflight", "run", "train"]
