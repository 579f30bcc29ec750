"""The RePo block: OLMo's sequential block whose attention rotates q and k by per-head real positions.

Deltas from `olmo.model.OLMoSequentialBlock` (everything else is inherited unchanged):

- f_phi (RePo layers only, `olmo_repo.rope.f_phi`): one real position per head and token from the block
  input x [B, T, d_model], with gate_map, content_map: d_model -> d_model/8 and final_map: d_model/8 ->
  n_heads, no bias, OLMo's normal init; fp32 results (see `olmo_repo.rope`).
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
from torch.utils.checkpoint import checkpoint

from .config import PositionMode, layer_modes
from .modes import F_PHI_WEIGHTS
from .rope import f_phi, inv_frequencies, rotate_qk
from .upstream import olmo as olmo_upstream
from .upstream.olmo import BiasAndPositions, KVCache

__all__ = ["RepoSequentialBlock", "predict_positions", "repo_blocks"]


class RepoSequentialBlock(OLMoSequentialBlock):
    """A sequential block in `nope` or `repo` mode (rope layers stay stock `OLMoSequentialBlock`s)."""

    def __init__(self, layer_id: int, config: ModelConfig, cache: BufferCache):
        super().__init__(layer_id, config, cache)
        self.pe_mode = layer_modes(config)[layer_id]
        assert self.pe_mode != PositionMode.rope, "rope layers are stock OLMoSequentialBlocks"
        if self.pe_mode == PositionMode.repo:
            hidden = config.d_model // 8
            # nn.Linear, not bare Parameters: OLMo's optimizer grouping and FSDP expect modules.
            # F_PHI_WEIGHTS: gate_map, content_map: d_model -> hidden; final_map: hidden -> n_heads.
            shapes = ((config.d_model, hidden), (config.d_model, hidden), (hidden, config.n_heads))
            for name, (d_in, d_out) in zip(F_PHI_WEIGHTS, shapes, strict=True):
                self.add_module(name, nn.Linear(d_in, d_out, bias=False, device=config.init_device))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.pe_mode == PositionMode.repo:
            for name in F_PHI_WEIGHTS:
                init_normal(
                    getattr(self, name),
                    std=self.config.init_std,
                    init_cutoff_factor=self.config.init_cutoff_factor,
                )

    def predict_positions(self, x: Tensor) -> Tensor:
        """f_phi: block input x [B, T, d_model] -> positions [B, n_heads, T], fp32 (float64 for a float64 model)."""
        mixed = x.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled(x.device.type)
        if not (mixed and torch.is_grad_enabled()):
            return self._f_phi(x)
        # In mixed precision autograd would keep a low-precision copy of x and f_phi's fp32 activations,
        # up to 2x the block input's memory per RePo layer; recomputing them in backward is ~1% of its FLOPs.
        return checkpoint(self._f_phi, x, use_reentrant=False)

    def _f_phi(self, x: Tensor) -> Tensor:
        return f_phi(x, self.gate_map.weight, self.content_map.weight, self.final_map.weight)

    def forward(
        self,
        x: Tensor,
        attention_bias: Tensor | None = None,
        layer_past: KVCache | None = None,
        use_cache: bool = False,
        max_doc_len: int | None = None,
        cu_doc_lens: Tensor | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        positions = self.predict_positions(x) if self.pe_mode == PositionMode.repo else None
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
        q, k, v = olmo_upstream.heads(self, q, k, v)  # [B, H, T, hd]
        if positions is not None:
            inv_freq = inv_frequencies(q.shape[-1], self.config.rope_theta, q.device)
            q, k = rotate_qk(q, k, positions, inv_freq)
        return olmo_upstream.attend(self, q, k, v, bias, layer_past, use_cache, max_doc_len, cu_doc_lens)


@torch.no_grad()
def predict_positions(model: nn.Module, input_ids: Tensor, **forward_kwargs) -> dict[int, Tensor]:
    """Run `model` on input_ids [B, T] and return {layer id: positions [B, n_heads, T] fp32} of its RePo layers.

    Hooks read each RePo block's input and apply its f_phi, so what comes back is what the forward used.
    """
    positions: dict[int, Tensor] = {}
    blocks = repo_blocks(model)
    hooks = [
        b.register_forward_pre_hook(
            lambda b, args: positions.__setitem__(b.layer_id, b.predict_positions(args[0]))
        )
        for b in blocks
    ]
    try:
        model(input_ids, **forward_kwargs)
    finally:
        for h in hooks:
            h.remove()
    return positions


def repo_blocks(model: nn.Module) -> list[RepoSequentialBlock]:
    """The blocks of `model` (an OLMo model, wrapped or not) that predict positions, in layer order."""
    return [
        m for m in model.modules() if isinstance(m, RepoSequentialBlock) and m.pe_mode == PositionMode.repo
    ]
