#!/usr/bin/env python
"""Evaluate a model on RULER NIAH (offline) or on the paper's suite; see `--help` and README "Evaluation"."""

import sys

from olmo_repo.eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
