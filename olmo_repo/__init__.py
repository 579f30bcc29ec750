"""RePo (context re-positioning) as a plugin over ai2-olmo. Importing this package installs the block factory."""

from .block import RepoSequentialBlock, predict_positions
from .config import PositionMode, RepoModelConfig, RepoTrainConfig, layer_modes, repo_layer_ids
from .registry import build_model, install

install()

__all__ = [
    "PositionMode",
    "RepoSequentialBlock",
    "RepoModelConfig",
    "RepoTrainConfig",
    "build_model",
    "install",
    "layer_modes",
    "predict_positions",
    "repo_layer_ids",
]
