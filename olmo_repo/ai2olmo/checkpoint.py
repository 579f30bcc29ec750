"""Reading this project's unsharded OLMo checkpoints: `load_model`.

An unsharded OLMo checkpoint is a directory (local, http(s):// or s3://) with `config.yaml` (a
`RepoTrainConfig`, or a stock `TrainConfig`), `model.pt` (the model's state dict) and, from a training run,
`optim.pt` and `train.pt`. Stock `OLMo.from_checkpoint` cannot read RePo checkpoints: its `ModelConfig`
rejects the `pe_*` keys. Initialising a RePo run from a stage-1 checkpoint is `olmo_repo.ai2olmo.stage1`.
"""

from __future__ import annotations

import torch
from olmo.aliases import PathOrStr
from olmo.model import OLMo
from olmo.util import resource_path

from ..errors import RepoError
from ..integrity import require_intact
from ..modes import index_blend, repo_layer_ids
from ..rope import set_index_blend
from ..upstream.olmo import make_state_dict_compatible
from ..upstream.torch import read_train_state
from .config import RepoModelConfig
from .registry import build_model

__all__ = ["load_model", "trained_steps"]


def load_model(checkpoint_dir: PathOrStr, device: str = "cpu") -> OLMo:
    """Build the model of an unsharded checkpoint and load its weights strictly. Returns it in eval mode, its
    RePo layers at the index blend's p of the checkpoint's step (`trained_steps`)."""
    config = RepoModelConfig.load(
        resource_path(checkpoint_dir, "config.yaml"), key="model", validate_paths=False
    )
    config.init_device = "cpu"
    model = build_model(config)
    require_intact(weights := resource_path(checkpoint_dir, "model.pt"))
    state_dict = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict(make_state_dict_compatible(model, state_dict))
    blend = index_blend(config.pe_blend_init, config.pe_blend_steps, trained_steps(checkpoint_dir, config))
    set_index_blend(model, blend)  # as training scored it at the checkpoint's step
    return model.to(torch.device(device)).eval()


def trained_steps(input: PathOrStr, config: RepoModelConfig) -> int:
    """The optimizer steps a checkpoint was trained for (train.pt's `global_step`), where its index blend
    depends on it (a blend on, RePo layers); else 0. A checkpoint without train.pt is then refused: its p
    would be a guess."""
    if not (config.pe_blend_init > 0 and config.pe_blend_steps > 0 and repo_layer_ids(config)):
        return 0
    try:
        state = read_train_state(resource_path(input, "train.pt"))
    except FileNotFoundError:
        raise RepoError(
            f"{input} has no train.pt, whose step sets the p its RePo layers score with (model.pe_blend_init="
            f"{config.pe_blend_init}, model.pe_blend_steps={config.pe_blend_steps}): pass the checkpoint "
            "folder a run saved (stepN-unsharded), with its train.pt"
        ) from None
    return int(state["global_step"])
