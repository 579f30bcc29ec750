"""RePo on Hugging Face for Llama: transformers' Llama with the RePo attention of `modeling_repo_olmo2.py`.

Deltas from `transformers.models.llama` (everything else is inherited unchanged), through the same four
mixins as OLMo 2/3:

- `RepoLlamaAttention` (`nope` and `repo` layers; `rope` layers keep the stock `LlamaAttention`):
  `LlamaAttention` with `RepoAttentionMixin`. q, k and v are Llama's plain projections (no q/k norm;
  `attention_bias` as configured); in `repo` layers f_phi predicts one position per key/value head from the
  attention's input, which Llama (norm before each sublayer) gives as the normed hidden state
  `input_layernorm(x)`, what q, k and v read too. q and k are rotated with the inverse frequencies of the
  config's RoPE (default, linear, YaRN or Llama 3's), keys cached rotated; no sliding window.
- `RepoLlamaDecoderLayer`, `RepoLlamaModel`, `RepoLlamaForCausalLM`: `LlamaDecoderLayer`, `LlamaModel`,
  `LlamaForCausalLM` with those attentions and `output_positions` ({layer id: [B, H_kv, T] fp32}); tied or
  untied embeddings as the config says.

Remote code with `modeling_repo_olmo2.py` (the mixins), `configuration_repo_llama.py`,
`configuration_repo_olmo2.py`, `rope.py`, `rotation.py` and `modes.py`.
"""

from __future__ import annotations

from torch import Tensor
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRotaryEmbedding,
)

from .configuration_repo_llama import RepoLlamaConfig
from .modeling_repo_olmo2 import (
    RepoAttentionMixin,
    RepoCausalLMMixin,
    RepoDecoderLayerMixin,
    RepoDecoderMixin,
    heads,
)

__all__ = [
    "RepoLlamaAttention",
    "RepoLlamaDecoderLayer",
    "RepoLlamaForCausalLM",
    "RepoLlamaModel",
]


class RepoLlamaAttention(RepoAttentionMixin, LlamaAttention):
    """Llama attention of a `nope` or `repo` layer."""

    rotary_class = LlamaRotaryEmbedding

    def project_qkv(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`LlamaAttention.forward`'s q [B, H, T, hd], k and v [B, H_kv, T, hd]: the projections alone."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = (heads(proj(hidden_states), self.head_dim).transpose(1, 2) for proj in projections)
        return q, k, v


class RepoLlamaPreTrainedModel(LlamaPreTrainedModel):
    config: RepoLlamaConfig
    config_class = RepoLlamaConfig


class RepoLlamaDecoderLayer(RepoDecoderLayerMixin, LlamaDecoderLayer):
    """`LlamaDecoderLayer` whose attention is `RepoLlamaAttention` in `nope`/`repo` layers."""

    attention_class = RepoLlamaAttention


class RepoLlamaModel(RepoDecoderMixin, RepoLlamaPreTrainedModel, LlamaModel):
    """`LlamaModel` over `RepoLlamaDecoderLayer`s."""

    layer_class = RepoLlamaDecoderLayer


class RepoLlamaForCausalLM(RepoCausalLMMixin, RepoLlamaPreTrainedModel, LlamaForCausalLM):
    """`LlamaForCausalLM` over a `RepoLlamaModel`."""

    decoder_class = RepoLlamaModel
