"""wandb 0.31.0: two things ai2-olmo 0.6.0 and this project's start of W&B need around it.

- `wandb.init` replaces `sys.excepthook` and `sys.exit` with its own, which print tracebacks; when it fails
  (no network, a bad key) the process is left with them. `init_keeping_hooks` puts the originals back on
  failure, so the failure can be one line.
- ai2-olmo's `Trainer.close` calls `wandb.finish(exit_code=..., quiet=True)`; wandb 0.31 has no `quiet`.
  `finish` ends the run first, which leaves the stock call nothing to do.
"""

from __future__ import annotations

import sys
from typing import Any

import wandb

__all__ = ["CANARIES", "finish", "init_keeping_hooks"]

VERSION = "0.31.0"
CANARIES = {
    "wandb.sdk.wandb_init.init": "0738c7a75b041edb",
    "wandb.sdk.wandb_run.Run.finish": "717ff6ae55ec2062",
}


def init_keeping_hooks(**kwargs: Any) -> None:
    """`wandb.init(**kwargs)`; if it raises, `sys.excepthook` and `sys.exit` are restored before the error."""
    hooks = sys.excepthook, sys.exit
    try:
        wandb.init(**kwargs)
    except BaseException:
        sys.excepthook, sys.exit = hooks
        raise


def finish(exit_code: int) -> None:
    """End the W&B run, if any, the way ai2-olmo's `Trainer.close` means to (without `quiet`)."""
    if wandb.run is not None:
        wandb.finish(exit_code=exit_code)
