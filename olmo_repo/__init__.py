"""RePo (context re-positioning) for the ai2-olmo and OLMo-core trainers, stock transformers and stock vLLM.

`import olmo_repo` is light: the mode rule (`PositionMode`, `layer_modes`, `repo_layer_ids`, from
`olmo_repo.modes`) needs nothing; the OLMo side loads on first use of one of its names below, and that first
use installs the block factory (`olmo_repo.ai2olmo.registry.install`: `OLMoBlock.build` builds RePo/NoPE blocks from
the config). The Hugging Face side, `olmo_repo.hf`, needs transformers and torch only, not ai2-olmo.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .modes import PositionMode, layer_modes, repo_layer_ids

if TYPE_CHECKING:
    from .ai2olmo.block import RepoSequentialBlock, predict_positions, repo_blocks
    from .ai2olmo.config import RepoModelConfig, RepoTrainConfig, olmo2_model_config
    from .ai2olmo.registry import build_model, install

_OLMO_SIDE = {
    "RepoModelConfig": "ai2olmo.config",
    "RepoTrainConfig": "ai2olmo.config",
    "olmo2_model_config": "ai2olmo.config",
    "RepoSequentialBlock": "ai2olmo.block",
    "predict_positions": "ai2olmo.block",
    "repo_blocks": "ai2olmo.block",
    "build_model": "ai2olmo.registry",
    "install": "ai2olmo.registry",
}

__all__ = [
    "PositionMode",
    "RepoModelConfig",
    "RepoSequentialBlock",
    "RepoTrainConfig",
    "build_model",
    "install",
    "layer_modes",
    "olmo2_model_config",
    "predict_positions",
    "repo_blocks",
    "repo_layer_ids",
]


def __getattr__(name: str) -> Any:
    if name not in _OLMO_SIDE:
        raise AttributeError(f"module 'olmo_repo' has no attribute {name!r}")
    import_module(".ai2olmo.registry", __name__).install()
    value = getattr(import_module(f".{_OLMO_SIDE[name]}", __name__), name)
    globals()[name] = value
    return value
