"""RePo on Hugging Face for OLMo 3: transformers' Olmo3 (sliding windows) with the RePo attention of Olmo2.

transformers' Olmo3 is its Olmo2 with two changes: `layer_types` gives each layer a sliding window or full
attention, and each layer type has its own RoPE (`rope_parameters.sliding_attention`, `.full_attention`; OLMo
3's long-context models scale only the full-attention one). The deltas from `transformers.models.olmo3` are
`modeling_repo_olmo2`'s, with those two kept:

- `RepoOlmo3Attention` (`nope` and `repo` layers): `Olmo3Attention` with the `RepoAttentionMixin` of
  `modeling_repo_olmo2.py` (q, k rotated by f_phi's positions after the q/k norms, keys cached rotated, the
  layer's sliding window passed to the attention function as `Olmo3Attention.forward` does); a `repo` layer
  rotates with the frequencies and attention factor of its own layer type's RoPE. Sliding windows need nothing
  else: they mask by index, whatever the positions.
- `RepoOlmo3DecoderLayer`, `RepoOlmo3Model`, `RepoOlmo3ForCausalLM`: `Olmo3DecoderLayer`, `Olmo3Model`,
  `Olmo3ForCausalLM` with those attentions and `output_positions` ({layer id: [B, H_kv, T] fp32}).

Remote code with `modeling_repo_olmo2.py` (which it builds on), the two configuration files, `rope.py`,
`rotation.py` and `modes.py`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers.models.olmo3.modeling_olmo3 import (
    Olmo3Attention,
    Olmo3DecoderLayer,
    Olmo3ForCausalLM,
    Olmo3Model,
    Olmo3PreTrainedModel,
    Olmo3RotaryEmbedding,
)

from .configuration_repo_olmo3 import RepoOlmo3Config
from .modeling_repo_olmo2 import (
    RepoAttentionMixin,
    RepoCausalLMMixin,
    RepoDecoderLayerMixin,
    RepoDecoderMixin,
)

__all__ = [
    "RepoOlmo3Attention",
    "RepoOlmo3DecoderLayer",
    "RepoOlmo3ForCausalLM",
    "RepoOlmo3Model",
]


class RepoOlmo3Attention(RepoAttentionMixin, Olmo3Attention):
    """Olmo3 attention of a `nope` or `repo` layer (`Olmo3Attention.__init__` sets `attention_type` and
    `sliding_window`)."""

    rotary_class = Olmo3RotaryEmbedding

    def rope_frequencies(self, device: Any) -> tuple[Tensor, float]:
        """The RoPE of this layer's type (sliding or full attention): inverse frequencies, attention factor."""
        kind = self.attention_type
        return getattr(self.rotary_emb, f"{kind}_inv_freq"), getattr(
            self.rotary_emb, f"{kind}_attention_scaling"
        )


class RepoOlmo3PreTrainedModel(Olmo3PreTrainedModel):
    config: RepoOlmo3Config
    config_class = RepoOlmo3Config


class RepoOlmo3DecoderLayer(RepoDecoderLayerMixin, Olmo3DecoderLayer):
    """`Olmo3DecoderLayer` whose attention is `RepoOlmo3Attention` in `nope`/`repo` layers."""

    attention_class = RepoOlmo3Attention


class RepoOlmo3Model(RepoDecoderMixin, RepoOlmo3PreTrainedModel, Olmo3Model):
    """`Olmo3Model` over `RepoOlmo3DecoderLayer`s."""

    layer_class = RepoOlmo3DecoderLayer


class RepoOlmo3ForCausalLM(RepoCausalLMMixin, RepoOlmo3PreTrainedModel, Olmo3ForCausalLM):
    """`Olmo3ForCausalLM` over a `RepoOlmo3Model`."""

    decoder_class = RepoOlmo3Model
