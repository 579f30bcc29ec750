"""RePo on vLLM for Llama and Qwen 3 (`repo_llama`, `repo_qwen3`): vLLM's own models with the RePo attention of
`olmo_repo.vllm.model` (`RepoAttention`, the one step every family shares) in their `nope`/`repo` layers.

Deltas from vLLM's Llama (`vllm.model_executor.models.llama`; everything else is inherited unchanged):

- `RepoLlamaAttention`: `LlamaAttention` with `RepoAttention`: q, k, v from the fused projection (with
  `attention_bias` as configured), no q/k norm, q and k rotated by the positions f_phi predicts from the
  attention's input, which Llama (norm before each sublayer) gives as the normed hidden state, what q, k and
  v read too; `rope` layers run the stock forward. RePo positions rotate with the inverse frequencies of
  transformers' `LlamaRotaryEmbedding` for the config (default, linear, YaRN or Llama 3's), as `olmo_repo.hf`.
- `RepoLlamaDecoderLayer`, `RepoLlamaForCausalLM`: Llama's, built through the seams vLLM gives them (the decoder
  layer's `attn_layer_type`, the causal LM's `layer_type`); tied embeddings as the config says.

Qwen 3: vLLM's Qwen 3 decoder layer builds its `Qwen3Attention` with no seam to swap it, but its decoder layer,
model and causal LM compute exactly what Llama's do (its MLP is Llama's without bias; the canaries of
`olmo_repo.upstream.vllm` pin all of them). So `RepoQwen3ForCausalLM` is Llama's causal LM whose decoder layers
build `RepoQwen3Attention`: vLLM's `Qwen3Attention` (q and k split into heads and normed per head, over
head_dim, which may differ from hidden_size / num_attention_heads), with `RepoAttention`, constructed from the
arguments Llama's decoder layer passes, as Qwen 3's decoder layer would construct it. The one check of vLLM's Qwen 3
model that Llama's lacks (no sliding windows in some layers only) is in the plugin's config check
(`olmo_repo.vllm.config.repo_config`).

Tensor parallel: as for OLMo (`rank_kv_heads`); Qwen 3's per-head norms need no gather.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
from vllm.config import VllmConfig
from vllm.model_executor.models.utils import extract_layer_index

from ..modes import layer_modes
from ..upstream.vllm import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    Qwen3Attention,
    set_default_rope_theta,
)
from .model import RepoAttention

__all__ = [
    "RepoLlamaAttention",
    "RepoLlamaDecoderLayer",
    "RepoLlamaForCausalLM",
    "RepoQwen3Attention",
    "RepoQwen3DecoderLayer",
    "RepoQwen3ForCausalLM",
]


class RepoLlamaAttention(RepoAttention, LlamaAttention):
    """vLLM's Llama attention with the rotary step of a `nope` or `repo` layer replaced (no q/k norm)."""

    rotary_class = LlamaRotaryEmbedding

    def __init__(self, *, config: PretrainedConfig, prefix: str, **kwargs: Any):
        super().__init__(config=config, prefix=prefix, **kwargs)
        self.init_repo_attention(config, prefix, layer_modes(config)[extract_layer_index(prefix)])


class RepoQwen3Attention(RepoAttention, Qwen3Attention):
    """vLLM's Qwen 3 attention with the rotary step of a `nope` or `repo` layer replaced, built from the
    arguments of Llama's decoder layer."""

    rotary_class = Qwen3RotaryEmbedding

    def __init__(
        self,
        *,
        config: PretrainedConfig,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        max_position_embeddings: int,
        quant_config: Any,
        bias: bool,
        bias_o_proj: bool,
        cache_config: Any,
        prefix: str,
        attn_type: str,
    ):
        # What vLLM's Qwen3DecoderLayer passes; its o_proj has no bias whatever `bias_o_proj` (Llama's) says.
        set_default_rope_theta(config, default_theta=1000000)
        super().__init__(
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            rope_parameters=config.rope_parameters,
            max_position=max_position_embeddings,
            head_dim=getattr(config, "head_dim", None),
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=bias,
            cache_config=cache_config,
            quant_config=quant_config,
            prefix=prefix,
            attn_type=attn_type,
        )
        self.init_repo_attention(config, prefix, layer_modes(config)[extract_layer_index(prefix)])

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen 3: an RMSNorm per head (over head_dim), after the split into heads, before the rotation
        (restated from `Qwen3Attention.forward`)."""
        q = self.q_norm(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.view(*k.shape[:-1], -1, self.head_dim)).view(k.shape)
        return q, k


class RepoLlamaDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm decoder layer over `attention_class`."""

    attention_class: type[nn.Module] = RepoLlamaAttention

    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config: PretrainedConfig | None = None):
        super().__init__(vllm_config, prefix, config, attn_layer_type=self.attention_class)


class RepoQwen3DecoderLayer(RepoLlamaDecoderLayer):
    """Qwen 3's decoder layer: Llama's with `RepoQwen3Attention`."""

    attention_class = RepoQwen3Attention


class RepoLlamaForCausalLM(LlamaForCausalLM):
    """vLLM's Llama causal LM over `decoder_layer` (tied embeddings as the config says)."""

    decoder_layer: type[nn.Module] = RepoLlamaDecoderLayer

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=self.decoder_layer)


class RepoQwen3ForCausalLM(RepoLlamaForCausalLM):
    """vLLM's Qwen 3 causal LM: Llama's over `RepoQwen3DecoderLayer`."""

    decoder_layer = RepoQwen3DecoderLayer
