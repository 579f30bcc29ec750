"""OLMo-core 3.0.0 (the OLMo-core side, `olmo_repo.olmocore`, its own environment `.venv-core`): the internals
its RePo attention relies on.

What OLMo-core lacks, and what `olmo_repo.olmocore.attention` does about it:

- No hook between q/k/v and attention for another rotation. `RepoAttention` overrides the private
  `Attention._prepare_qkv` (q, k, v projected, normed and, in stock layers, rotated by RoPE) and rotates by
  RePo positions there, before any backend sees q and k.
- No way to build an attention of another class with OLMo-core's own choices (backend, sliding window, norms,
  dtype). `RepoAttentionConfig.build` lets `AttentionConfig.build` make the module without RoPE and then
  gives it the class `RepoAttention` (which adds no state of its own besides the RePo core's), relying on
  `build` returning a plain `Attention` whose `__init__` is the one read here.
- `Attention.apply_tp` and `Attention.init_weights` know only OLMo-core's projections: `RepoAttention` calls
  them, then plans and initialises f_phi's.

- torch.distributed.checkpoint (OLMo-core's checkpoint format) finds a checkpoint file cut short only when it
  reads it, as a traceback in the middle of a run: `Metadata.storage_data` maps every stored item to the private
  `_StorageInfo` (file, offset, length), from which `truncated_files` tells before anything is loaded.

`CANARIES` holds the source hash of each at ai2-olmo-core 3.0.0 (`olmo_repo.upstream.source_hash`);
`tests/core/test_upstream_core.py` checks them in `.venv-core`, so that an OLMo-core upgrade fails loudly until
this module and `olmo_repo.olmocore.attention` are read against the new code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CANARIES", "VERSION", "truncated_files"]

VERSION = "3.0.0"

CANARIES = {  # source hashes on ai2-olmo-core==3.0.0
    "olmo_core.nn.attention.Attention._prepare_qkv": "c0a18a375b9842c3",
    "olmo_core.nn.attention.Attention.__init__": "ee4e9f0a67be948e",
    "olmo_core.nn.attention.AttentionConfig.build": "38d7942d51190706",
    "olmo_core.nn.attention.Attention.apply_tp": "48b95443e5ea9ddf",
    "olmo_core.nn.attention.Attention.init_weights": "cef70febea03d9ac",
    "torch.distributed.checkpoint.filesystem._StorageInfo": "74febf0cc7db965c",
}


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
