"""`scripts/demo.py`, killed by SIGKILL (its whole process group: no exception, no clean-up) right after a given
stage records itself finished, or right after the evaluation records its first section. The kill-and-rerun
tests start it in a session of its own:

    python tests/demo_killed.py STAGE|evaluation:1 OUT [demo arguments ...]
"""

from __future__ import annotations

import json
import os
import signal
import sys

FIRST_SECTION = "evaluation:1"


def _die() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _kill_after(stage: str) -> None:
    from olmo_repo.experiments.demo import demo
    from olmo_repo.experiments.stages import Stages

    finish, write_text = Stages.finish, Stages.write_text

    def finish_then_die(self: Stages, name: str, **facts: float) -> None:
        finish(self, name, **facts)
        if name == stage:
            _die()

    def write_then_die(self: Stages, name: str, text: str) -> bool:
        written = write_text(self, name, text)
        if name == demo.EVALUATION and json.loads(text):
            _die()
        return written

    if stage == FIRST_SECTION:
        Stages.write_text = write_then_die  # type: ignore[method-assign]
    else:
        Stages.finish = finish_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    from olmo_repo.cli.demo import main

    _kill_after(sys.argv.pop(1))
    raise SystemExit(main(sys.argv[1:]))
