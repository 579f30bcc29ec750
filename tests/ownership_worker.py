"""A training process in miniature, for the stop-mode tests of tests/test_ownership.py: it dies with its
launcher and holds the save folder at its rank, as both trainers' workers do, then waits to be stopped.

    (torchrun) python -m tests.ownership_worker SAVE_FOLDER
"""

from __future__ import annotations

import os
import sys
import time

from olmo_repo.ownership import die_with_launcher, held

if __name__ == "__main__":
    die_with_launcher()
    with held(sys.argv[1], "save_folder", int(os.environ.get("RANK", "0"))):
        print(f"holding {os.getpid()}", flush=True)
        time.sleep(600)
