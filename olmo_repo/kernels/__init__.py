"""Triton kernels of RePo's own work, run on CUDA by `olmo_repo.rope` (so every backend gets them through
`RepoLayer`): the rotation of q and k at real positions (`rotate_qk`) and f_phi's tail (`f_phi_tail`).

`olmo_repo.rope` keeps the torch code of both as the reference and the CPU path, and imports this package only
where a kernel is to run (`select.wanted`): Triton is not needed to import `rope.py`, which travels without
this package into converted checkpoints as remote code. Before a kernel's variant first runs on a device it is
checked there against float64 (`rotation_ready`, `f_phi_ready`, decided once per device and specialisation in
`select`); a variant that fails runs the torch path. The tests run every kernel under Triton's interpreter
(`TRITON_INTERPRET=1`) against `rope.py` and float64, and compile each for Hopper (sm_90) without a device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import select
from .f_phi import f_phi_tail
from .f_phi import ready as f_phi_ready
from .rotation import ready as rotation_ready
from .rotation import rotate_qk

__all__ = ["f_phi_ready", "f_phi_tail", "rotate_qk", "rotation_ready", "select", "supports"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def supports(*tensors: Tensor) -> bool:
    """Whether the kernels take these tensors: fp32, bf16 or fp16 (float64 goes to the reference), and not
    DTensors (tensor parallelism: their sharded layout is the reference's to handle)."""
    return all(t.dtype in _DTYPES and not hasattr(t, "full_tensor") for t in tensors)
