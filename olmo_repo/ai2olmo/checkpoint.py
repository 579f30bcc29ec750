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

from ..integrity import require_intact
from ..upstream.olmo import make_state_dict_compatible
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
    require_intact(weights := resource_path(checkpoint_dir, "model.pt"))
    state_dict = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict(make_state_dict_compatible(model, state_dict))
    return model.to(torch.device(device)).eval()
