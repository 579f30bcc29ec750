"""What the HF modeling file imports as `from .rope import ...`: inside the package, `olmo_repo.rope`;
in a converted checkpoint this module is replaced by a copy of `olmo_repo/rope.py` (torch-only), beside a copy of
the `olmo_repo/rotation.py` it imports."""

from ..rope import *  # noqa: F403
from ..rope import __all__  # noqa: F401
