"""`RepoLlamaConfig`: transformers' `LlamaConfig` plus one position mode per layer.

Deltas from `LlamaConfig`: the position keys and their checks, exactly as `RepoOlmo2Config` has them
(`RepoPositionKeys`: run by `@strict` on construction and on `validate()`, one `ValueError` naming the key). A
RePo layer rotates its positions with the config's RoPE, which must not depend on the sequence length: default,
linear, YaRN or Llama 3's (`rope_type: llama3`, as Llama 3.1 and 3.2 have it); `dynamic` and `longrope` are
refused.

Remote code, like `configuration_repo_olmo2.py`: transformers, the standard library and its neighbours only.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .configuration_repo_olmo2 import RepoPositionKeys

__all__ = ["RepoLlamaConfig"]


@strict
class RepoLlamaConfig(RepoPositionKeys, LlamaConfig):
    __doc__ = RepoPositionKeys.__doc__

    model_type = "repo_llama"
