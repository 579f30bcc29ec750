"""The RePo block: OLMo's sequential block whose attention rotates q and k by real positions.

Deltas from `olmo.model.OLMoSequentialBlock` (everything else is inherited unchanged):

- `RepoLayer` (`olmo_repo.rope`): in RePo layers f_phi predicts the positions from the block input x
  [B, T, d_model]; its weights are the block's (`transformer.blocks.N.gate_map.weight`, ...), with OLMo's
  normal init. What q and k are rotated by is `RepoLayer.rotation_positions`: those positions blended with
  each token's index (the index blend's p, which the trainer sets every step), or, as an evaluation-time
  ablation, the index or no rotation (`position_source`). The index is what stock OLMo's RoPE rotates by:
  the KV cache's past length + 0..T-1.
- `attention()` rotates q and k by those positions (RePo) or not at all (NoPE), after the q/k norms and
  *before* the KV cache, so cached keys are already rotated by their own positions (stock OLMo caches
  unrotated keys and re-rotates them by integer index, which a learned position cannot be).
- The positions reach `attention()` in its attention-bias argument (`BiasAndPositions`), which the stock
  `forward` passes through untouched, also into its fine-grained activation-checkpoint call: the
  recomputation in backward sees the same positions, and nothing is stored on `self`. The stock parts of
  `attention()` and this reliance on `forward` live in `olmo_repo.upstream.olmo`, with their canaries.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from olmo.config import ModelConfig
from olmo.initialization import init_normal
from olmo.model import BufferCache, OLMoSequentialBlock
from torch import Tensor

from ..modes import F_PHI_WEIGHTS, PositionMode, layer_modes
from ..rope import RepoLayer, record_positions, repo_layers
from ..upstream import olmo as olmo_upstream
from ..upstream.olmo import BiasAndPositions, KVCache

__all__ = ["RepoSequentialBlock", "predict_positions", "repo_blocks"]


class RepoSequentialBlock(RepoLayer, OLMoSequentialBlock):
    """A sequential block in `nope` or `repo` mode (rope layers stay stock `OLMoSequentialBlock`s)."""

    def __init__(self, layer_id: int, config: ModelConfig, cache: BufferCache):
        super().__init__(layer_id, config, cache)
        mode = layer_modes(config)[layer_id]
        assert mode != PositionMode.rope, "rope layers are stock OLMoSequentialBlocks"
        self.init_repo(
            mode,
            layer_id=layer_id,
            d_model=config.d_model,
            n_kv_heads=config.effective_n_kv_heads,
            head_dim=config.d_model // config.n_heads,
            rope_theta=config.rope_theta,
            device=config.init_device,
        )

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.pe_mode == PositionMode.repo:
            for name in F_PHI_WEIGHTS:
                init_normal(
                    getattr(self, name),
                    std=self.config.init_std,
                    init_cutoff_factor=self.config.init_cutoff_factor,
                )

    def forward(
        self,
        x: Tensor,
        attention_bias: Tensor | None = None,
        layer_past: KVCache | None = None,
        use_cache: bool = False,
        max_doc_len: int | None = None,
        cu_doc_lens: Tensor | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        if self.pe_mode != PositionMode.repo:
            bias = BiasAndPositions(attention_bias, None)
            return super().forward(x, bias, layer_past, use_cache, max_doc_len, cu_doc_lens)  # type: ignore[arg-type]
        past = 0 if layer_past is None else layer_past[0].shape[-2]
        index = torch.arange(past, past + x.shape[1], device=x.device)  # [T]: what stock RoPE rotates by
        # Under mixed precision f_phi and att_proj read one bf16 cast of x, which autograd then keeps once.
        with self.shared_cast(x, self.att_proj) as x_in:
            positions = self.rotation_positions(x_in, index)  # [B, H_kv, T] (or [H_kv, T]; None: no rotation)
            bias = BiasAndPositions(attention_bias, positions)
            return super().forward(x, bias, layer_past, use_cache, max_doc_len, cu_doc_lens)  # type: ignore[arg-type]

    def attention(  # type: ignore[override]
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attention_bias: BiasAndPositions,
        layer_past: KVCache | None = None,
        use_cache: bool = False,
        max_doc_len: int | None = None,
        cu_doc_lens: Tensor | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        """Stock `OLMoBlock.attention` (`olmo_repo.upstream.olmo`) with the rotation by real positions
        (or none) before the KV cache instead of integer RoPE after it."""
        bias, positions = attention_bias
        q, k, v = olmo_upstream.heads(self, q, k, v)  # [B, H, T, hd], [B, H_kv, T, hd]
        if positions is not None:
            q, k = self.apply_positions(q, k, positions)
        return olmo_upstream.attend(self, q, k, v, bias, layer_past, use_cache, max_doc_len, cu_doc_lens)


@torch.no_grad()
def predict_positions(model: nn.Module, input_ids: Tensor, **forward_kwargs) -> dict[int, Tensor]:
    """Run `model` on input_ids [B, T]; return {layer id: positions [B, H_kv, T] fp32} of its RePo layers, as
    the forward computed them."""
    with record_positions(model) as positions:
        model(input_ids, **forward_kwargs)
    return positions


def repo_blocks(model: nn.Module) -> list[RepoSequentialBlock]:
    """The blocks of `model` (an OLMo model, wrapped or not) that predict positions, in layer order."""
    return [b for b in repo_layers(model) if isinstance(b, RepoSequentialBlock)]
