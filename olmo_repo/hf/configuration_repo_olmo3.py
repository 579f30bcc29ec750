"""`RepoOlmo3Config`: transformers' `Olmo3Config` (OLMo 3: sliding windows) plus one position mode per layer.

Deltas from `Olmo3Config`: the position keys and their checks, exactly as `RepoOlmo2Config` has them
(`RepoPositionKeys`); the RoPE check covers both of OLMo 3's RoPEs
(`rope_parameters.sliding_attention` and `.full_attention`): a RePo layer rotates its positions with the RoPE of
its own layer type. The position mode and the attention type of a layer are independent: a RePo layer may have a
sliding window or full attention, as `layer_types` says.

Remote code, like `configuration_repo_olmo2.py`: transformers, the standard library and its neighbours only.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import Olmo3Config

from .configuration_repo_olmo2 import RepoPositionKeys

__all__ = ["RepoOlmo3Config"]


@strict
class RepoOlmo3Config(RepoPositionKeys, Olmo3Config):
    __doc__ = RepoPositionKeys.__doc__

    model_type = "repo_olmo3"

    def ropes(self) -> dict[str, dict[str, Any]]:
        """OLMo 3's two RoPEs: a RePo layer rotates with its layer type's."""
        ropes = self.rope_parameters or {}
        return {f"rope_parameters.{kind}": ropes[kind] for kind in sorted(ropes)}
