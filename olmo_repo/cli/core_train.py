"""`scripts/core_train.py`: train with OLMo-core's Trainer from a config of configs/olmocore/ (.venv-core)."""

from __future__ import annotations

from ..errors import RepoError
from . import fail

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from olmo_core.exceptions import OLMoConfigurationError

    from ..olmocore.train import build, main_options, run

    try:
        opts, overrides, build_config = main_options(argv, "core_train.py")
        run(build(build_config, opts, overrides), opts)
    except (RepoError, OLMoConfigurationError, OSError) as e:
        return fail("core_train.py", e)
    return 0
