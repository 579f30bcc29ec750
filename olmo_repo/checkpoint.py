"""Reading this project's checkpoints.

An unsharded OLMo checkpoint is a directory (local, http(s):// or s3://) with `config.yaml` (a
`RepoTrainConfig`, or a stock `TrainConfig`) and `model.pt` (the model's state dict). Stock
`OLMo.from_checkpoint` cannot read RePo checkpoints: its `ModelConfig` rejects the `pe_*` keys.
"""

from __future__ import annotations

import torch
from olmo.aliases import PathOrStr
from olmo.model import OLMo
from olmo.util import resource_path

from .config import RepoModelConfig
from .registry import build_model

__all__ = ["load_model"]


def load_model(checkpoint_dir: PathOrStr, device: str = "cpu") -> OLMo:
    """Build the model of an unsharded checkpoint and load its weights strictly. Returns it in eval mode."""
    config = RepoModelConfig.load(
        resource_path(checkpoint_dir, "config.yaml"), key="model", validate_paths=False
    )
    config.init_device = "cpu"
    model = build_model(config)
    state_dict = torch.load(resource_path(checkpoint_dir, "model.pt"), map_location="cpu", weights_only=True)
    model.load_state_dict(model._make_state_dict_compatible(state_dict)[0])
    return model.to(torch.device(device)).eval()
