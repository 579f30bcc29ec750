"""What the HF files import as `from .modes import ...`: inside the package, `olmo_repo.modes`; in a converted
checkpoint this module is replaced by a copy of `olmo_repo/modes.py` (standard library only)."""

from ..modes import *  # noqa: F403
from ..modes import __all__  # noqa: F401
