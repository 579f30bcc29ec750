"""Train with OLMo's Trainer and the RePo model.

Usage:
    torchrun --nproc_per_node=N scripts/train.py CONFIG [--key=value ...]
    python scripts/train.py CONFIG [--key=value ...]          # one process

CONFIG is a YAML file (configs/*.yaml); each --key=value overrides a config key, dotted for nested keys
(--model.pe_start_layer=5, --save_folder=runs/x, --stop_at=100). The config's strategy (fsdp or ddp) on
nccl with CUDA, on gloo without. Rerunning the same command resumes from the latest checkpoint in
save_folder (or remote_save_folder). See docs/training.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if not Path(argv[0]).is_file():  # before the imports, which take seconds
        print(
            f"train.py: error: config file {argv[0]} does not exist (expected a YAML file such as configs/*.yaml)",
            file=sys.stderr,
        )
        return 1
    from olmo.exceptions import OLMoError

    from ..eval.inloop import install
    from ..train.run import train

    install()  # `niah_*` evaluators (olmo_repo.train does not import olmo_repo.eval)
    try:
        train(argv[0], argv[1:])
    except OLMoError as e:  # a config or checkpoint problem: its message, not a traceback
        print(f"train.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # `python -m olmo_repo.cli.train`, as the demo starts its runs
    raise SystemExit(main())
