"""RePo, NoPE or RoPE per layer as an OLMo-core attention variant: `RepoAttentionConfig`, registered in OLMo-core's
`SequenceMixerConfig` registry as "repo", the way OLMo-core registers its own ("attention", "gated_delta_net").

`RepoAttentionConfig` is OLMo-core's `AttentionConfig` plus the position keys every model config of this project
takes from one declaration (`olmo_repo.modes.PositionKeys`: `pe_mode`, `pe_start_layer`, `pe_layer_ids` and the
index blend's schedule `pe_blend_init`, `pe_blend_steps`). Its `build` gets the layer index, so one
block config serves every layer of a `TransformerConfig` (its presets `olmo2_1B_v2`, `olmo3_7B`, `olmo3_32B`,
...: `with_position_modes` swaps it in):

- a `rope` layer is OLMo-core's own `Attention`, built by `AttentionConfig.build` (state and numerics stock);
- a `nope` or `repo` layer is a `RepoAttention`, constructed with the arguments OLMo-core's `build` gives its
  own (sliding window, backend, q/k norms, dtype) but no RoPE module; in `repo` layers the RePo core
  (`olmo_repo.rope.RepoLayer`) adds f_phi (`gate_map`, `content_map`, `final_map`: direct children, so
  checkpoints name them `blocks.{i}.attention.gate_map.weight`) and rotates q and k by the positions it
  predicts from the attention's input x. OLMo-2/3 blocks are `reordered_norm`: x is the residual stream, the
  tensor w_q/w_k/w_v see.

The rotation happens in `_prepare_qkv`, before attention, so OLMo-core's backends (torch SDPA, flash 2/3),
sliding windows, document masking (`cu_doc_lens`: a token's positions come from its own hidden state, so
documents need no position reset), grouped-query attention (one position per KV head, shared by its query
group) and context parallelism (each rank predicts the positions of its own tokens: nothing to exchange) take
rotated q and k as they take RoPE's. The index blend (1 - p) z + p i takes i, each token's index, exactly as
OLMo-core's RoPE counts it in that call (`olmo_repo.upstream.olmo_core.rope_index`: after a KV cache's past, from 0
in each document under `cu_doc_lens`); a context-parallel shard has none, and a blend there is refused before a
run starts. The trainer sets p before every step (`olmo_repo.olmocore.callbacks.PositionsCallback`). f_phi's
weights are child `nn.Linear`s of the attention, so OLMo-core's FLOP
count (`num_flops_per_token` counts 6 FLOPs per parameter of the module), its optimizer groups (weight decay)
and FSDP see them like any projection; `init_weights` and `apply_tp` (tensor parallelism: f_phi split like a
feed-forward) add them explicitly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.attention import Attention, AttentionConfig, AttentionType
from olmo_core.nn.attention.base import SequenceMixerConfig
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.rope import RoPEConfig, RoPEScalingConfig
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.nn.transformer.init import InitMethod, init_linear
from torch import Tensor, nn
from torch.distributed import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Shard, distribute_tensor

from ..modes import (
    F_PHI_WEIGHTS,
    PositionKeys,
    PositionMode,
    check_index_blend,
    check_position_modes,
    index_blend,
    layer_modes,
)
from ..rope import RepoLayer, rank_kv_heads
from ..upstream.olmo_core import attention_kwargs, rope_index

__all__ = [
    "RepoAttention",
    "RepoAttentionConfig",
    "attention_config",
    "index_blend_at",
    "repo_attention",
    "with_position_modes",
]

# OLMo-core's names for the sizes that the position-mode checks name.
_KEYS = {"n_layers": "n_layers", "n_heads": "n_heads", "n_kv_heads": "n_kv_heads"}


@SequenceMixerConfig.register("repo")
@dataclass
class RepoAttentionConfig(AttentionConfig, PositionKeys):
    """OLMo-core's `AttentionConfig` with the position keys of every model config of this project
    (`olmo_repo.modes.PositionKeys`: a position mode per layer and the index blend's schedule)."""

    def stock(self) -> AttentionConfig:
        """The same attention without the position-mode keys: what a `rope` layer is built from."""
        names = [f.name for f in dataclasses.fields(AttentionConfig)]
        return AttentionConfig(**{name: getattr(self, name) for name in names})

    def layer_modes(self, n_layers: int) -> list[PositionMode]:
        return layer_modes(self, n_layers=n_layers)

    def check(self, n_layers: int, prefix: str = "model.block.sequence_mixer.") -> None:
        """One `OLMoConfigurationError` naming the key (with `prefix`) for a selection or head count that this
        attention cannot serve."""
        try:
            check_position_modes(
                self.pe_mode,
                self.pe_start_layer,
                self.pe_layer_ids,
                n_layers=n_layers,
                n_heads=self.n_heads,
                n_kv_heads=self.n_kv_heads or self.n_heads,
                keys=_KEYS,
                prefix=prefix,
            )
            has_repo = PositionMode.repo in self.layer_modes(n_layers)
            check_index_blend(
                self.pe_blend_init, self.pe_blend_steps, has_repo=has_repo, prefix=prefix, training=True
            )
        except ValueError as e:
            raise OLMoConfigurationError(str(e)) from None
        if self.pe_mode == PositionMode.rope:
            return
        if self.name != AttentionType.default:
            raise OLMoConfigurationError(
                f"{prefix}name={self.name}: pe_mode={self.pe_mode} needs the default attention (separate "
                "w_q/w_k/w_v); set name: default"
            )
        if self.pe_mode == PositionMode.repo and self.rope is None:
            raise OLMoConfigurationError(
                f"{prefix}rope is unset: pe_mode=repo rotates by RoPE's frequencies (rope.theta); set rope"
            )
        if self.rope is not None and self.rope.partial_rotary_factor != 1.0:
            raise OLMoConfigurationError(
                f"{prefix}rope.partial_rotary_factor={self.rope.partial_rotary_factor}: pe_mode="
                f"{self.pe_mode} rotates whole heads; set it to 1.0"
            )

    def build(
        self,
        d_model: int,
        *,
        layer_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: BufferCache | None = None,
    ) -> Attention:
        self.check(n_layers)
        mode = self.layer_modes(n_layers)[layer_idx]
        stock = self.stock()
        if mode == PositionMode.rope:
            return stock.build(
                d_model, layer_idx=layer_idx, n_layers=n_layers, init_device=init_device, cache=cache
            )
        # OLMo-core's own arguments (window, backend, norms, dtype) without its RoPE module.
        kwargs = attention_kwargs(
            dataclasses.replace(stock, rope=None),
            d_model,
            layer_idx=layer_idx,
            n_layers=n_layers,
            init_device=init_device,
            cache=cache,
        )
        return RepoAttention(mode, layer_idx, self.rope, **kwargs)


class RepoAttention(Attention, RepoLayer):
    """OLMo-core's `Attention` of a `nope` or `repo` layer: no RoPE module; in `repo` layers q and k are rotated
    by the positions f_phi predicts from the attention's input."""

    def __init__(self, pe_mode: PositionMode, layer_idx: int, rope: RoPEConfig | None, **kwargs: Any):
        """OLMo-core's `Attention(**kwargs)` (built without RoPE), then the RePo core for `pe_mode`; `rope` (the
        layer's RoPE config, unbuilt) gives the rotation's frequencies: its theta and scaling (YaRN, PI, ...)."""
        super().__init__(**kwargs)
        self.repo_rope = rope
        self.init_repo(
            pe_mode,
            layer_id=layer_idx,
            d_model=kwargs["d_model"],
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            rope_theta=None if rope is None else float(rope.theta),
            device=kwargs["init_device"],
            dtype=kwargs["dtype"],
        )

    def _prepare_qkv(self, x: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:
        # The private step OLMo-core rotates in (3.0.0; canary: olmo_repo.upstream.olmo_core).
        q, k, v = super()._prepare_qkv(x, **kwargs)  # [B, T, H(kv), hd], q/k normed, not rotated
        if self.pe_mode != PositionMode.repo:
            return q, k, v
        index = None  # a context-parallel shard's tokens have no index here (a blend is refused there)
        if not self.cp_enabled:  # [T] or [B, T]: the positions OLMo-core's RoPE gives these tokens
            start, docs = kwargs.get("start_pos"), kwargs.get("cu_doc_lens")
            index = rope_index(*x.shape[:2], start_pos=start, cu_doc_lens=docs, device=x.device)
        q, k = self.reposition(x, q, k, index=index, tokens_first=True)
        return q, k, v

    def predict_positions(self, x: Tensor) -> Tensor:
        """f_phi's positions [B, H_kv, T] (observed whole); under tensor parallelism f_phi's partial sums,
        reduced, then this rank's key/value heads."""
        positions = super().predict_positions(x)
        if isinstance(positions, DTensor):
            mesh = positions.device_mesh
            heads = rank_kv_heads(positions.shape[-2], mesh.size(), mesh.get_local_rank())
            positions = positions.full_tensor()[..., heads.start : heads.stop, :]
        return positions

    def apply_tp(
        self,
        tp_mesh: DeviceMesh,
        input_layout: Placement | None = None,
        output_layout: Placement | None = None,
        use_local_output: bool = True,
        float8_enabled: bool = False,
    ) -> None:
        """OLMo-core's plan for q/k/v/out, and f_phi's like a feed-forward's: gate_map and content_map
        column-wise (the d/8 hidden units split over the ranks), final_map row-wise (its partial sums reduced:
        [B, T, n_kv_heads] floats per layer); each rank rotates the KV heads (and their query groups) it holds."""
        super().apply_tp(tp_mesh, input_layout, output_layout, use_local_output, float8_enabled)
        for name, placement in zip(F_PHI_WEIGHTS, (Shard(0), Shard(0), Shard(1)), strict=True):
            if hasattr(self, name):
                linear = getattr(self, name)
                weight = distribute_tensor(linear.weight.data, tp_mesh, [placement])
                linear.register_parameter("weight", nn.Parameter(weight, linear.weight.requires_grad))

    def rope_frequencies(self, device: torch.device) -> tuple[Tensor, float]:
        """OLMo-core's inverse frequencies [head_dim / 2] and attention factor for this layer's RoPE config:
        stock, or scaled (YaRN, position interpolation, ...) exactly as its RoPE layers compute them."""
        rope = self.repo_rope
        if rope is None or rope.scaling is None:
            return super().rope_frequencies(device)
        return _scaled_frequencies(rope.scaling, rope.theta, self.head_dim, device)

    def f_phi_maps(self) -> list[nn.Linear]:
        """gate_map, content_map, final_map ([] in a `nope` layer)."""
        return [getattr(self, name) for name in F_PHI_WEIGHTS if hasattr(self, name)]

    def init_weights(
        self,
        *,
        init_method: InitMethod,
        d_model: int,
        block_idx: int,
        num_blocks: int,
        std: float = 0.02,
        generator: torch.Generator | None = None,
    ) -> None:
        """OLMo-core's init, then f_phi's like OLMo's: normal with `init_std`, truncated at 3 std."""
        super().init_weights(
            init_method=init_method,
            d_model=d_model,
            block_idx=block_idx,
            num_blocks=num_blocks,
            std=std,
            generator=generator,
        )
        for linear in self.f_phi_maps():
            init_linear(linear, std=std, generator=generator)


_FREQUENCIES: dict[tuple[str, int, int, torch.device], tuple[Tensor, float]] = {}


def _scaled_frequencies(
    scaling: RoPEScalingConfig, theta: int, head_dim: int, device: torch.device
) -> tuple[Tensor, float]:
    """Cached by value (configs are unhashable): every RePo layer asks on every forward."""
    key = (repr(scaling), theta, head_dim, device)
    if key not in _FREQUENCIES:
        with torch.inference_mode(False), torch.autocast(device.type, enabled=False):
            inv_freq, factor = scaling.compute_scaled_inv_freq(theta=theta, dim=head_dim, device=device)
        _FREQUENCIES[key] = inv_freq.float(), float(factor)
    return _FREQUENCIES[key]


def attention_config(attention: AttentionConfig, keys: PositionKeys) -> RepoAttentionConfig:
    """`attention` (an `AttentionConfig`, e.g. a preset's `block.sequence_mixer`) with the position keys `keys` (a
    position mode per layer and the index blend's schedule)."""
    fields = {f.name: getattr(attention, f.name) for f in dataclasses.fields(AttentionConfig)}
    return RepoAttentionConfig(**fields, **dataclasses.asdict(keys))


def with_position_modes(config: TransformerConfig, pe_mode: str, **keys: Any) -> TransformerConfig:
    """A copy of an OLMo-core `TransformerConfig` (a preset) whose attention, in its block and in every block
    override, takes `pe_mode` in the selected layers, with the other position keys `keys` (`modes.PositionKeys`'s
    fields: `pe_start_layer`, `pe_layer_ids`, `pe_blend_init`, `pe_blend_steps`). Raises `OLMoConfigurationError`
    naming the key."""
    try:
        position_keys = PositionKeys(pe_mode=pe_mode, **keys)
    except TypeError as e:  # a key PositionKeys does not declare
        raise OLMoConfigurationError(f"with_position_modes: {e}") from None
    config = config.copy()
    blocks = config.block.values() if isinstance(config.block, dict) else [config.block]
    blocks = [*blocks, *(config.block_overrides or {}).values()]
    for block in blocks:
        if not isinstance(block.sequence_mixer, AttentionConfig):
            raise OLMoConfigurationError(
                f"model.block.sequence_mixer is a {type(block.sequence_mixer).__name__}: position modes need "
                "attention"
            )
        block.sequence_mixer = attention_config(block.sequence_mixer, position_keys)
        block.sequence_mixer.check(config.n_layers)
    return config


def repo_attention(config: TransformerConfig) -> RepoAttentionConfig | None:
    """The attention config of the model's RePo layers (the first, where block configs differ), None for a
    model without any: where a trainer reads the index blend's schedule."""
    for i, block in enumerate(config.resolved_block_configs):
        att = block.sequence_mixer
        if isinstance(att, RepoAttentionConfig) and att.layer_modes(config.n_layers)[i] == PositionMode.repo:
            return att
    return None


def index_blend_at(config: TransformerConfig, step: int) -> float:
    """p of the index blend of the model of `config` after `step` optimizer steps (`modes.index_blend` of its
    RePo attention's schedule); 0 for a model without RePo layers."""
    att = repo_attention(config)
    return 0.0 if att is None else index_blend(att.pe_blend_init, att.pe_blend_steps, step)
