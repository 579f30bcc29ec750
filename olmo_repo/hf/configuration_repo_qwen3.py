"""`RepoQwen3Config`: transformers' `Qwen3Config` plus one position mode per layer.

Deltas from `Qwen3Config`: the position keys and their checks, exactly as `RepoOlmo2Config` has them
(`RepoPositionKeys`: run by `@strict` on construction and on `validate()`, one `ValueError` naming the key),
the RoPE check included. As in `RepoOlmo3Config`, the position mode and the attention type of a layer
(`layer_types`: sliding window or full attention) are independent.

Remote code, like `configuration_repo_olmo2.py`: transformers, the standard library and its neighbours only.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

from .configuration_repo_olmo2 import RepoPositionKeys

__all__ = ["RepoQwen3Config"]


@strict
class RepoQwen3Config(RepoPositionKeys, Qwen3Config):
    __doc__ = RepoPositionKeys.__doc__

    model_type = "repo_qwen3"
