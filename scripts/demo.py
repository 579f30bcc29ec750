"""`make demo`: build a tiny corpus offline, pre-train a tiny RoPE model on CPU, continue it with RePo and
with RoPE through scripts/train.py, and print a table. Usage: python scripts/demo.py [OUT_DIR]"""

import sys
from pathlib import Path

from olmo_repo.demo import run_demo

if __name__ == "__main__":
    if len(sys.argv) > 1:
        run_demo(Path(sys.argv[1]).resolve())
    else:
        run_demo()
