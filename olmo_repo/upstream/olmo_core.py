"""OLMo-core 3.0.0 (the OLMo-core side, `olmo_repo.olmocore`, its own environment `.venv-core`): the internals
its RePo attention relies on.

What OLMo-core lacks, and what `olmo_repo.olmocore.attention` does about it:

- No hook between q/k/v and attention for another rotation. `RepoAttention` overrides the private
  `Attention._prepare_qkv` (q, k, v projected, normed and, in stock layers, rotated by RoPE) and rotates by
  RePo positions there, before any backend sees q and k.
- No way to build an attention of another class with OLMo-core's own choices (backend, sliding window, norms,
  dtype): `AttentionConfig.build` computes `Attention`'s keyword arguments and calls the class by name.
  `attention_kwargs` restates that computation for the default attention (the only one a RePo or NoPE layer
  takes), so that `RepoAttentionConfig.build` constructs `RepoAttention` with OLMo-core's own arguments.
- `Attention.apply_tp` and `Attention.init_weights` know only OLMo-core's projections: `RepoAttention` calls
  them, then plans and initialises f_phi's.
- No token index outside RoPE: the index blend of a RePo layer (`modes.PositionKeys`) needs each token's position
  as OLMo-core's RoPE counts it in `_prepare_qkv` (after a KV cache's past, restarting per document under
  `cu_doc_lens`). `rope_index` restates that rule of `RotaryEmbedding.forward`. A context-parallel shard has no
  such index for a RePo layer (OLMo-core shards RoPE's sin/cos tables only, for layers with a RoPE module): the
  launcher refuses a blend there (`olmo_repo.olmocore.checks.check_experiment`).

- Importing `olmo_core.nn.attention` logs a warning where transformer_engine is missing (every CPU machine and
  most GPU ones; this project never uses TE attention), ahead of every command's output and its one-line error:
  `quiet_optional_backends` raises that module's logger to ERROR.

- torch.distributed.checkpoint (OLMo-core's checkpoint format) finds a checkpoint file cut short only when it
  reads it, as a traceback in the middle of a run: `Metadata.storage_data` maps every stored item to the private
  `_StorageInfo` (file, offset, length), from which `truncated_files` tells before anything is loaded.

`CANARIES` holds the source hash of each at ai2-olmo-core 3.0.0 (`olmo_repo.upstream.source_hash`);
`tests/core/test_upstream_core.py` checks them in `.venv-core`, so that an OLMo-core upgrade fails loudly until
this module and `olmo_repo.olmocore.attention` are read against the new code.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

__all__ = [
    "CANARIES",
    "TE_LOGGER",
    "VERSION",
    "attention_kwargs",
    "quiet_optional_backends",
    "rope_index",
    "truncated_files",
]

VERSION = "3.0.0"

CANARIES = {  # source hashes on ai2-olmo-core==3.0.0
    "olmo_core.nn.attention.Attention._prepare_qkv": "c0a18a375b9842c3",
    "olmo_core.nn.attention.Attention.__init__": "ee4e9f0a67be948e",
    "olmo_core.nn.attention.AttentionConfig.build": "38d7942d51190706",
    "olmo_core.nn.attention.Attention.apply_tp": "48b95443e5ea9ddf",
    "olmo_core.nn.attention.Attention.init_weights": "cef70febea03d9ac",
    "olmo_core.nn.rope.RotaryEmbedding.forward": "8cd619bb6adabfc9",
    "torch.distributed.checkpoint.filesystem._StorageInfo": "74febf0cc7db965c",
}


TE_LOGGER = "olmo_core.nn.attention.te_attn_api"  # logs "transformer_engine unavailable" at import


def quiet_optional_backends() -> None:
    """No "transformer_engine unavailable, disabling TE attention" warning when OLMo-core is imported."""
    logging.getLogger(TE_LOGGER).setLevel(logging.ERROR)


def attention_kwargs(
    config: Any, d_model: int, *, layer_idx: int, n_layers: int, init_device: str, cache: Any
) -> dict[str, Any]:
    """The keyword arguments `AttentionConfig.build` passes to `Attention` for the default attention (`config.name
    == "default"`), restated from ai2-olmo-core 3.0.0: the config's fields that are set (the `AttentionConfig`
    fields only: a subclass's own keys are not `Attention`'s), the layer's window where the sliding-window config
    gives this layer one (else no global RoPE where `rope.no_global_rope`), the dtype as torch's, no
    `attention_sinks` unless on, and no fused-v2-only MXFP8 flag (refused when on, as `build` refuses it)."""
    from dataclasses import fields

    from olmo_core.exceptions import OLMoConfigurationError
    from olmo_core.nn.attention import AttentionConfig

    names = {f.name for f in fields(AttentionConfig)} - {"name"}
    kwargs = {k: v for k, v in config.as_dict(exclude_none=True, recurse=False).items() if k in names}
    window = kwargs.pop("sliding_window", None)
    if window is not None and window.should_use_swa(layer_idx, n_layers):
        kwargs["window_size"] = window.get_window_size(layer_idx, n_layers)
    elif kwargs.get("rope") is not None and kwargs["rope"].no_global_rope:
        kwargs["rope"] = None
    kwargs.update(dtype=kwargs.pop("dtype").as_pt(), d_model=d_model, init_device=init_device, cache=cache)
    if not kwargs.get("attention_sinks", False):
        kwargs.pop("attention_sinks", None)
    for key in ("mxfp8_projections", "mxfp8_qkv_projection", "mxfp8_out_projection"):
        if kwargs.pop(key, None):
            raise OLMoConfigurationError(f"['{key}'] are only supported by fused_v2 attention")
    return kwargs


def rope_index(batch: int, seq_len: int, *, start_pos: Any, cu_doc_lens: Any, device: Any) -> Any:
    """Each token's position as ai2-olmo-core 3.0.0's `RotaryEmbedding.forward` rotates it when `_prepare_qkv`
    calls it (queries and keys of the same `seq_len` tokens): `start_pos + t` under a KV cache (`start_pos`: the
    cache's length, a 0-d tensor, or an int), the position within its document where `cu_doc_lens` is given
    (intra-document RoPE over the flattened batch: [B, T]), else `t` ([T])."""
    import torch

    if cu_doc_lens is not None:
        flat = torch.arange(batch * seq_len, device=device, dtype=cu_doc_lens.dtype)
        doc = torch.bucketize(flat, cu_doc_lens[1:], right=True)
        return (flat - cu_doc_lens[doc]).view(batch, seq_len)  # [B, T]
    index = torch.arange(seq_len, device=device)  # [T]
    return index if start_pos is None else index + start_pos


def truncated_files(directory: Path, metadata: Any) -> list[tuple[Path, int, int]]:
    """The files of the torch.distributed.checkpoint `directory` shorter than its `metadata` says, as (file,
    size or -1 when missing, bytes needed)."""
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        return []
    needed: dict[str, int] = {}
    for info in storage.values():  # _StorageInfo(relative_path, offset, length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    short = []
    for name, need in sorted(needed.items()):
        file = directory / name
        size = file.stat().st_size if file.is_file() else -1
        if size < need:
            short.append((file, size, need))
    return short
