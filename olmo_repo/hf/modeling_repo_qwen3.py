"""RePo on Hugging Face for Qwen 3: transformers' Qwen3 with the RePo attention of `modeling_repo_olmo2.py`.

Deltas from `transformers.models.qwen3` (everything else is inherited unchanged), through the same four
mixins as OLMo 2/3:

- `RepoQwen3Attention` (`nope` and `repo` layers; `rope` layers keep the stock `Qwen3Attention`):
  `Qwen3Attention` with `RepoAttentionMixin`. q and k are projected, split into heads and normed per head
  (`q_norm`, `k_norm`: RMSNorms over head_dim, which may differ from hidden_size / num_attention_heads), then
  rotated, as `Qwen3Attention.forward` does: the norm comes before the rotation, by RePo's positions here. In
  `repo` layers f_phi predicts one position per key/value head from the attention's input, which Qwen 3
  (norm before each sublayer) gives as the normed hidden state, what q, k and v read too. The rotation uses
  the config's RoPE (default, linear, YaRN or Llama 3's); keys are cached rotated; the layer's sliding window
  (`Qwen3Attention.__init__` sets it from `layer_types`) reaches the attention function as in the stock
  forward.
- `RepoQwen3DecoderLayer`, `RepoQwen3Model`, `RepoQwen3ForCausalLM`: `Qwen3DecoderLayer`, `Qwen3Model`,
  `Qwen3ForCausalLM` with those attentions and `output_positions` ({layer id: [B, H_kv, T] fp32}); tied or
  untied embeddings as the config says.

Remote code with `modeling_repo_olmo2.py` (the mixins), `configuration_repo_qwen3.py`,
`configuration_repo_olmo2.py`, `rope.py`, `rotation.py` and `modes.py`.
"""

from __future__ import annotations

from torch import Tensor
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3PreTrainedModel,
    Qwen3RotaryEmbedding,
)

from .configuration_repo_qwen3 import RepoQwen3Config
from .modeling_repo_olmo2 import (
    RepoAttentionMixin,
    RepoCausalLMMixin,
    RepoDecoderLayerMixin,
    RepoDecoderMixin,
    heads,
)

__all__ = [
    "RepoQwen3Attention",
    "RepoQwen3DecoderLayer",
    "RepoQwen3ForCausalLM",
    "RepoQwen3Model",
]


class RepoQwen3Attention(RepoAttentionMixin, Qwen3Attention):
    """Qwen3 attention of a `nope` or `repo` layer (`Qwen3Attention.__init__` sets `sliding_window`)."""

    rotary_class = Qwen3RotaryEmbedding

    def project_qkv(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`Qwen3Attention.forward`'s q [B, H, T, hd], k and v [B, H_kv, T, hd]: split into heads first, then
        q and k normed per head (over head_dim), before any rotation."""
        q = self.q_norm(heads(self.q_proj(hidden_states), self.head_dim))
        k = self.k_norm(heads(self.k_proj(hidden_states), self.head_dim))
        v = heads(self.v_proj(hidden_states), self.head_dim)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class RepoQwen3PreTrainedModel(Qwen3PreTrainedModel):
    config: RepoQwen3Config
    config_class = RepoQwen3Config


class RepoQwen3DecoderLayer(RepoDecoderLayerMixin, Qwen3DecoderLayer):
    """`Qwen3DecoderLayer` whose attention is `RepoQwen3Attention` in `nope`/`repo` layers."""

    attention_class = RepoQwen3Attention


class RepoQwen3Model(RepoDecoderMixin, RepoQwen3PreTrainedModel, Qwen3Model):
    """`Qwen3Model` over `RepoQwen3DecoderLayer`s."""

    layer_class = RepoQwen3DecoderLayer


class RepoQwen3ForCausalLM(RepoCausalLMMixin, RepoQwen3PreTrainedModel, Qwen3ForCausalLM):
    """`Qwen3ForCausalLM` over a `RepoQwen3Model`."""

    decoder_class = RepoQwen3Model
