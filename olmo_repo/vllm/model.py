"""RePo as a native vLLM model: Olmo2 (and Olmo 3) whose `nope`/`repo` layers rotate q and k by real positions.

Deltas from the Olmo2 attention and MLP of vLLM's OLMo-Hybrid model (`olmo_repo.upstream.vllm`; everything
else is Olmo2 as vLLM ran it natively up to 0.31, and as `transformers.models.olmo2` computes it):

- `rope` layers: unchanged (vLLM's RoPE from the config's `rope_parameters`).
- `nope` layers: no rotation.
- `repo` layers: a `RepoLayer` (`olmo_repo.rope`): f_phi predicts the positions from the layer's input x,
  the packed hidden states [num_tokens, d] of every sequence in the batch; q and k [num_tokens, heads,
  d_head] are rotated by them after the q/k norms, with the inverse frequencies and attention factor of
  transformers' `Olmo2RotaryEmbedding` for the config (default, linear or YaRN), exactly as `olmo_repo.hf`
  does. A token's positions depend only on its own hidden state, so keys enter the paged KV cache already
  rotated and prefix caching and chunked prefill stay exact.

OLMo 3 (`repo_olmo3`): the same model; each layer is built from its layer type's RoPE and sliding window
(`olmo_repo.upstream.vllm.layer_config`), as transformers' Olmo3 has them. Windows mask by index, so RePo
layers need nothing more for them.

Tensor parallel: heads are split across ranks; gate_map and content_map are replicated, final_map's rows
(one per key/value head) are split like the key/value heads, so each rank predicts the positions of its own.

`RepoAttention` holds all of the above for every family: `RepoOlmo2Attention` here, and Llama's and Qwen 3's
attentions (`olmo_repo.vllm.families`) are it mixed into vLLM's attention class of the family, each stating only
its q/k norm (`norm_qk`) and its transformers RoPE class (`rotary_class`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.models.olmo2.modeling_olmo2 import Olmo2RotaryEmbedding
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    WeightsMapper,
    extract_layer_index,
    maybe_prefix,
)
from vllm.platforms import current_platform

from ..modes import PositionMode, ScoredPositionKeys, layer_modes
from ..rope import RepoLayer, rank_kv_heads
from ..upstream.vllm import OlmoHybridAttention, OlmoHybridMLP, layer_config
from .config import repo_config

__all__ = [
    "RepoAttention",
    "RepoOlmo2Attention",
    "RepoOlmo2DecoderLayer",
    "RepoOlmo2ForCausalLM",
    "RepoOlmo2Model",
]


class RepoAttention(RepoLayer):
    """The one RePo attention step of every family, mixed into vLLM's attention class of the family (Olmo2's
    `OlmoHybridAttention`, `LlamaAttention`, `Qwen3Attention`), whose projections, norms, paged attention and
    output projection it keeps. A family states only its q/k norm (`norm_qk`) and the HF RoPE class whose
    frequencies RePo positions rotate with (`rotary_class`); `rope` layers run the stock forward."""

    rotary_class: type[nn.Module] = Olmo2RotaryEmbedding
    """transformers' RoPE of the family, as `olmo_repo.hf` rotates RePo positions with it."""

    def init_repo_attention(self, config: PretrainedConfig, prefix: str, pe_mode: str) -> None:
        """Called after the stock `__init__`: f_phi (repo) and the frequencies it rotates with; `nope` and
        `repo` layers drop the integer-position RoPE. `config` is the layer's HF config (OLMo 3: its view); its
        `pe_blend` and `pe_positions` (`modes.ScoredPositionKeys`: absent from the reference's format, whose
        checkpoints score at p = 0; `hf_overrides` may set them) say what RePo layers rotate by."""
        vllm_config = get_current_vllm_config()
        if pe_mode != PositionMode.rope:
            self.rotary_emb = None  # no path of a nope/repo layer rotates by integer positions
        # The CPU has no bf16 GEMM with an fp32 output, so f_phi would upcast its weights on every call: there
        # they are stored upcast once, their values rounded to the model dtype, and f_phi runs in fp32 on the
        # upcast x: the same products.
        self.model_dtype = vllm_config.model_config.dtype
        # Plain nn.Linear weights, not vLLM linear layers: f_phi multiplies them itself, accumulating in fp32,
        # and vLLM's CPU backend repacks the weights of its own layers for its GEMM.
        tp_size, tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.init_repo(
            pe_mode,
            layer_id=extract_layer_index(prefix),
            d_model=config.hidden_size,
            n_kv_heads=self.total_num_kv_heads,
            head_dim=self.head_dim,
            kv_heads=rank_kv_heads(self.total_num_kv_heads, tp_size, tp_rank),
            dtype=torch.float32 if current_platform.is_cpu() else None,
            index_blend=getattr(config, "pe_blend", ScoredPositionKeys.pe_blend),
            position_source=getattr(config, "pe_positions", ScoredPositionKeys.pe_positions),
        )
        if pe_mode != PositionMode.repo:
            return
        for weight in self.f_phi_weights():
            weight.weight_loader = self._load_f_phi  # type: ignore[attr-defined]
        # The inverse frequencies and attention factor that olmo_repo.hf rotates RePo positions with.
        rotary = self.rotary_class(config)
        self.register_buffer("inv_freq", rotary.inv_freq.float(), persistent=False)  # [d_head/2]
        self.attention_scaling = float(rotary.attention_scaling)

    def rope_frequencies(self, device: torch.device) -> tuple[torch.Tensor, float]:
        return self.inv_freq.float(), self.attention_scaling  # fp32 whatever vLLM does to buffers

    def _load_f_phi(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """vLLM's weight loader hook: the weight rounded to the model dtype (stored as f_phi's weights are)."""
        self.load_f_phi(param, loaded.to(self.model_dtype))

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The family's q/k norm on q, k [T, H * d_head], as its stock forward applies it before the rotation:
        none here (Llama); OLMo 2/3 and Qwen 3 override it."""
        return q, k

    def rotate(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The RePo step in place of `rotary_emb(positions, q, k)`: q, k [T, H * d_head] rotated by the positions
        f_phi predicts from hidden_states [T, d] (upcast where the weights are: CPU), blended with or replaced by
        the token index `positions` [T] as the config says; nope: as they are."""
        if self.pe_mode != PositionMode.repo:
            return q, k
        n = q.shape[0]
        x = hidden_states.to(self.gate_map.weight.dtype)
        q, k = self.reposition(
            x,
            q.view(n, self.num_heads, self.head_dim),
            k.view(n, self.num_kv_heads, self.head_dim),
            index=positions,
            tokens_first=True,
        )  # [T, H, d_head]
        return q.reshape(n, -1), k.reshape(n, -1)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """The stock forward (`OlmoHybridAttention`, `LlamaAttention`, `Qwen3Attention`: project, q/k norm,
        rotate, attend, project out) with `rotary_emb(positions, q, k)` replaced by `rotate` in nope/repo layers.
        f_phi reads what q, k and v read: the attention's input (OLMo: the residual stream; Llama, Qwen 3: the
        normed hidden state)."""
        if self.pe_mode == PositionMode.rope:
            return super().forward(positions, hidden_states)  # type: ignore[misc]
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotate(positions, hidden_states, *self.norm_qk(q, k))  # [T, H * d_head]
        out, _ = self.o_proj(self.attn(q, k, v))
        return out


class RepoOlmo2Attention(RepoAttention, OlmoHybridAttention):
    """vLLM's Olmo2 attention with the rotary step of a `nope` or `repo` layer replaced."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str, pe_mode: str):
        # OLMo 3: the layer type's RoPE and window (`layer_config`); self.config is that layer's view
        super().__init__(vllm_config=layer_config(vllm_config, extract_layer_index(prefix)), prefix=prefix)
        if pe_mode == PositionMode.nope:
            self._use_rope = False
        self.init_repo_attention(self.config, prefix, pe_mode)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """OLMo 2/3: RMSNorms over all heads (gathered across tensor-parallel ranks), before the split."""
        return self._apply_qk_norm(q, k)


class RepoOlmo2DecoderLayer(nn.Module):
    """Olmo2's post-norm block: x + norm(attention(x)), then h + norm(mlp(h))."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str, pe_mode: str):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.self_attn = RepoOlmo2Attention(
            vllm_config=vllm_config, prefix=f"{prefix}.self_attn", pe_mode=pe_mode
        )
        self.mlp = OlmoHybridMLP(vllm_config=vllm_config, prefix=f"{prefix}.mlp")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        h = hidden_states + self.post_attention_layernorm(self.self_attn(positions, hidden_states))
        return h + self.post_feedforward_layernorm(self.mlp(h))


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "inputs_embeds": 0})
class RepoOlmo2Model(nn.Module):
    """Embedding, the decoder layers with their position modes, final norm. Hidden states [num_tokens, d]."""

    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_stacked={
            ".self_attn.q_proj": (".self_attn.qkv_proj", "q"),
            ".self_attn.k_proj": (".self_attn.qkv_proj", "k"),
            ".self_attn.v_proj": (".self_attn.qkv_proj", "v"),
            ".gate_proj": (".gate_up_proj", 0),
            ".up_proj": (".gate_up_proj", 1),
        }
    )

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        model_config = vllm_config.model_config
        config = model_config.hf_config
        modes = layer_modes(repo_config(config, model_config.model))
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=f"{prefix}.embed_tokens"
        )
        self.layers = nn.ModuleList(
            RepoOlmo2DecoderLayer(vllm_config=vllm_config, prefix=p, pe_mode=modes[extract_layer_index(p)])
            for p in (f"{prefix}.layers.{i}" for i in range(config.num_hidden_layers))
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)  # [T, d]
        for layer in self.layers:
            h = layer(positions, h)
        return self.norm(h)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class RepoOlmo2ForCausalLM(nn.Module):
    """`RepoOlmo2Model` and the LM head (tied to the embedding when the config says so)."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = RepoOlmo2Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: object = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # The loader handles tied embeddings; the reference's converter writes stale rotary buffers.
        loader = AutoWeightsLoader(self, ignore_unexpected_suffixes=["rotary_emb.inv_freq"])
        return loader.load_weights(weights)
