"""A sharded `olmo_core` checkpoint (what an FSDP run leaves in `stepN/`) -> an unsharded one.

`unshard_checkpoint(input, output)` reads the shards with ai2-olmo's own `OlmoCoreCheckpointer.unshard_checkpoint`
(no process group, no GPU, any number of ranks that wrote them) and writes what the run's own unsharded save
(`stepN-unsharded/`) holds: `config.yaml` as saved by the run, `model.pt`, `optim.pt` and `train.pt` (rank 0's
trainer state). The optimizer state is re-keyed by parameter name, as FSDP's full optimizer state dict is, so
the output equals the unsharded save of the same step. It is input to `scripts/convert_to_hf.py`, a `load_path`
or a stage-1 checkpoint. Like the converters, it writes into a temporary directory beside `output` and renames
it at the end; an existing `output` is refused unless `force`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from olmo.aliases import PathOrStr
from olmo.checkpoint import OlmoCoreCheckpointer
from olmo.exceptions import OLMoCheckpointError
from olmo.util import resource_path
from safetensors import SafetensorError
from tqdm import tqdm

from ..output import check_distinct, check_replaceable, staged_dir
from .config import RepoTrainConfig
from .stage1 import check_stage1_state_dict, clean_param_name

__all__ = ["unshard_checkpoint"]


def _exists(checkpoint: PathOrStr, name: str) -> bool:
    try:
        resource_path(checkpoint, name)
    except FileNotFoundError:
        return False
    return True


def _check_input(checkpoint: PathOrStr) -> None:
    if _exists(checkpoint, "model/metadata.json") and _exists(checkpoint, "config.yaml"):
        return
    if _exists(checkpoint, "model.pt"):
        raise ValueError(f"{checkpoint} is unsharded already (it has model.pt): use it as it is")
    if _exists(checkpoint, "rank0.pt") or _exists(checkpoint, "model_and_optim/.metadata"):
        raise ValueError(
            f"{checkpoint} was written by another sharded checkpointer than olmo_core, which cannot be read with "
            "torch 2.13: only sharded_checkpointer=olmo_core checkpoints can be unsharded"
        )
    raise FileNotFoundError(
        f"{checkpoint} is not an olmo_core sharded checkpoint (no model/metadata.json and config.yaml): pass a "
        "stepN folder of an FSDP run with sharded_checkpointer=olmo_core"
    )


def _keyed_by_name(optim_state: dict[str, Any]) -> dict[str, Any]:
    """olmo_core's optimizer state ({id: state}, ids in the groups) keyed by clean parameter name instead."""
    names = {
        pid: clean_param_name(name)
        for g in optim_state["param_groups"]
        for pid, name in zip(g["params"], g["param_names"])
    }
    return {
        "state": {names[pid]: state for pid, state in optim_state["state"].items()},
        "param_groups": [
            {**g, "params": [names[p] for p in g["params"]]} for g in optim_state["param_groups"]
        ],
    }


def unshard_checkpoint(
    input: PathOrStr, output: PathOrStr, *, force: bool = False, model_only: bool = False
) -> Path:
    """Unshard the olmo_core checkpoint `input` (local, http(s):// or s3://) into the directory `output`.

    model_only: write config.yaml and model.pt only (enough for conversion; the optimizer state is twice the
    model's size). Reading train.pt needs `olmo_repo.upstream.torch.patch_torch_for_olmo()` applied (the
    command does it). Raises FileExistsError, FileNotFoundError or ValueError with one line naming the problem.
    """
    check_distinct(input, output)
    check_replaceable(output, force)  # before any heavy work
    _check_input(input)
    config_path = resource_path(input, "config.yaml")
    cfg = RepoTrainConfig.load(config_path, validate_paths=False)

    files = ["model.pt"] if model_only else ["model.pt", "optim.pt", "train.pt"]
    with tqdm(total=1 + len(files), desc=f"unshard {Path(str(input)).name}", unit="part") as bar:
        bar.set_postfix_str("reading shards")
        try:
            model, optim, train = OlmoCoreCheckpointer(cfg).unshard_checkpoint(
                input, load_optimizer_state=not model_only, load_trainer_state=not model_only
            )
        except (OSError, RuntimeError, SafetensorError) as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ValueError(
                f"{input} is incomplete or corrupt ({type(e).__name__}: {first_line}): unshard another stepN"
            ) from None
        bar.update()
        if check_stage1_state_dict(model, cfg.model):
            raise OLMoCheckpointError(f"{input} lacks the RePo weights its config.yaml asks for")
        states = {"model.pt": model, "optim.pt": optim and _keyed_by_name(optim), "train.pt": train}
        with staged_dir(output, force) as staging:
            shutil.copyfile(config_path, staging / "config.yaml")
            for name in files:
                bar.set_postfix_str(f"writing {name}")
                torch.save(states[name], staging / name)
                bar.update()
    return Path(output)
