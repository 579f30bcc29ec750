"""What the HF files import as `from .modes import ...`: inside the package, `olmo_repo.modes`; in a converted
checkpoint this module is replaced by a copy of `olmo_repo/modes.py` (standard library only)."""

from ..modes import (
    F_PHI_WEIGHTS,
    MODES,
    check_position_modes,
    layer_modes,
    parse_layer_ids,
    reference_mode,
    repo_layers,
    selected_layers,
)

__all__ = [
    "F_PHI_WEIGHTS",
    "MODES",
    "check_position_modes",
    "layer_modes",
    "parse_layer_ids",
    "reference_mode",
    "repo_layers",
    "selected_layers",
]
