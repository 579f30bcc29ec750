"""Triton kernels of RePo's own work, run on CUDA by `olmo_repo.rope` (so every backend gets them through
`RepoLayer`): the rotation of q and k at real positions (`rotate_qk`) and f_phi's tail (`f_phi_tail`).

`olmo_repo.rope` (f_phi) and `olmo_repo.rotation` keep the torch code of both as the reference and the CPU path;
`rope` imports this package only where a kernel is to run (`select.runs`): Triton is not needed to import
`rope.py`, which travels without this package into converted checkpoints as remote code. Before a kernel's variant
first runs on a device it is checked there against float64 (`rotation_ready`, `f_phi_ready`, decided once per
device and specialisation in `select`); a variant that fails runs the torch path. The tests run every kernel under
Triton's interpreter (`TRITON_INTERPRET=1`) against that torch code and float64, and compile each for Hopper
(sm_90) without a device.
"""

from __future__ import annotations

from . import select
from .f_phi import f_phi_tail
from .f_phi import ready as f_phi_ready
from .rotation import ready as rotation_ready
from .rotation import rotate_qk

__all__ = ["f_phi_ready", "f_phi_tail", "rotate_qk", "rotation_ready", "select"]
