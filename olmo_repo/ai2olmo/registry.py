"""Route OLMo's block factory to the RePo block, from the config.

`OLMoBlock.build` is a hard-coded classmethod and `BlockType` a closed Enum, so configs keep
`block_type: sequential` and `install()` wraps `build` once: a layer whose position mode is `nope` or
`repo` gets a `RepoSequentialBlock`; every other layer (and every layer of a stock `ModelConfig`) is built
by the stock factory, bit for bit.
"""

from __future__ import annotations

from olmo.config import ModelConfig
from olmo.model import BufferCache, OLMo, OLMoBlock

from ..modes import PositionMode, layer_modes
from ..upstream.olmo import STOCK_BLOCK_BUILD, route_block_build
from .block import RepoSequentialBlock

__all__ = ["build_model", "install"]


def _build(cls: type[OLMoBlock], layer_id: int, config: ModelConfig, cache: BufferCache) -> OLMoBlock:
    if layer_modes(config)[layer_id] == PositionMode.rope:
        return STOCK_BLOCK_BUILD(cls, layer_id, config, cache)
    return RepoSequentialBlock(layer_id, config, cache)


def install() -> None:
    """Make `OLMoBlock.build` RePo-aware (idempotent). The first use of an OLMo-side name of `olmo_repo`
    calls it, and so does `build_model`."""
    route_block_build(_build)


def build_model(config: ModelConfig) -> OLMo:
    """`olmo.model.OLMo(config)` with the factory installed: stock configs give stock models."""
    install()
    return OLMo(config)
