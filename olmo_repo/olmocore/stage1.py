"""Stage-1 initialisation of an OLMo-core run, strict: the recipe's start from a checkpoint without RePo weights.

OLMo-core's own `Trainer.load_checkpoint` cannot start a RePo model from a stage-1 checkpoint: with
`strict=True` torch.distributed.checkpoint fails on the absent f_phi keys, and with `strict=False` it only warns,
so any missing or mistyped key passes. Here, before loading:

- the checkpoint's model keys (and optimizer state, when it is loaded) fit the model by the stage-1 fit rule that
  the ai2-olmo side calls too (`olmo_repo.fit`): all of them, or all but every f_phi weight (`gate_map`,
  `content_map`, `final_map` of the RePo layers) and its optimizer state, with the model's shapes. Anything else
  is one `CheckpointFitError` naming the keys or layers (`check_stage1` runs the model part of this before a run
  starts, from the checkpoint's metadata alone).

Then every base tensor loads bit-exact (torch.distributed.checkpoint reads each rank's shards, FSDP or not),
the f_phi weights keep their init, and, with `load_optim_state` (the recipe continues the stage-1 optimizer),
each base parameter's AdamW state (`exp_avg`, `exp_avg_sq`, `step`) continues while the RePo parameters' starts
fresh. The optimizer's hyper-parameters (lr, weight decay, betas) are the run's config, for the base and the RePo
parameters alike, as in the ai2-olmo recipe: the stage-1 values in the checkpoint's param groups are not loaded
(`olmo_core.script_utils.get_lr_from_checkpoint` reads the stage-1 lr, to set the config's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from olmo_core.distributed.checkpoint import (
    load_state_dict,
    merge_state_dicts,
    prune_state_dict,
)
from olmo_core.io import join_path
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.train import Trainer
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from ..errors import RepoError
from ..fit import fit_stage1
from ..paths import is_url
from .checkpoint import MODEL_AND_OPTIM, not_a_checkpoint, read_metadata

__all__ = ["check_stage1", "load_stage1"]


def _checkpoint_dir(path: str) -> str:
    """`path/model_and_optim` (a run's step or a model-only checkpoint), or `path` if it is that directory."""
    if not is_url(path) and (Path(path) / ".metadata").is_file():
        return path
    return str(join_path(path, MODEL_AND_OPTIM))


def _metadata(path: str) -> tuple[str, Metadata]:
    directory = _checkpoint_dir(path)
    try:
        return directory, read_metadata(directory, "load_path=")
    except FileNotFoundError:
        raise RepoError(not_a_checkpoint(path, "load_path=")) from None


def _flat_keys(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat_keys(value, f"{name}."))
        else:
            out[name] = value
    return out


def _compare(path: str, expected: dict[str, Any], metadata: Metadata, prefixes: tuple[str, ...]) -> None:
    """The stage-1 fit rule (`olmo_repo.fit.fit_stage1`, the ai2-olmo side's too) on `expected` (flattened keys
    -> shapes) and the checkpoint's keys under `prefixes`; a non-tensor entry's shape is not compared."""
    stored = {
        k: tuple(v.size) if isinstance(v, TensorStorageMetadata) else tuple(expected.get(k, ()))
        for k, v in metadata.state_dict_metadata.items()
        if k.startswith(prefixes)
    }
    fit_stage1({k: tuple(v) for k, v in expected.items()}, stored, f"load_path={path}")


def check_stage1(path: str, model: TransformerConfig) -> None:
    """Check a local stage-1 checkpoint's model keys and shapes against `model` (built on the meta device),
    from its metadata alone; `RepoError` naming the keys."""
    _, metadata = _metadata(path)
    expected = {f"model.{k}": v.shape for k, v in model.build(init_device="meta").state_dict().items()}
    _compare(path, expected, metadata, ("model.",))


def load_stage1(trainer: Trainer, path: str, *, load_optim_state: bool = True) -> None:
    """Load the stage-1 checkpoint `path` into the trainer's model (and optimizer state) as the module
    docstring says; the trainer's own state (step, data position) stays at its start."""
    train_module = trainer.train_module
    directory, metadata = _metadata(path)
    has_optim = any(k.startswith("optim.state.") for k in metadata.state_dict_metadata)
    optim = load_optim_state and has_optim
    state = train_module.state_dict_to_load(metadata, optim=optim)  # every key of this model (and optimizer)
    flat = _flat_keys(state)
    shapes = {k: getattr(v, "shape", ()) for k, v in flat.items() if not k.startswith("optim.param_groups.")}
    _compare(path, shapes, metadata, ("model.", "optim.state.") if optim else ("model.",))
    # Load the base: model tensors and per-parameter optimizer state; the config's param groups stay.
    allowed = {k for k in metadata.state_dict_metadata if not k.startswith("optim.param_groups.")}
    prune_state_dict(state, allowed)
    load_state_dict(
        directory,
        state,
        process_group=trainer.checkpointer.process_group,
        pre_download=is_url(path),
        work_dir=trainer.work_dir,
    )
    # Everything not loaded (f_phi's init and fresh optimizer state, the param groups) as the run built it.
    merge_state_dicts(state, train_module.state_dict_to_load(metadata, optim=optim))
    train_module.load_state_dict(state)
