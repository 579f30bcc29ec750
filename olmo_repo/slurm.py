"""SLURM from inside a job: a training run stopped by SIGUSR1 (the scripts' --signal) requeues the job it runs
in, so that the next run resumes it. Standard library only: both trainers' runs (ai2-olmo's and OLMo-core's)
call it."""

from __future__ import annotations

import logging
import os
import subprocess

__all__ = ["requeue"]

log = logging.getLogger(__name__)


def requeue() -> None:
    """Put this SLURM job back in the queue (its next run resumes); outside SLURM, say how to resume."""
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        log.info("Stopped on SIGUSR1: rerun the same command to resume")
        return
    log.info("Stopped on SIGUSR1: requeueing SLURM job %s", job)
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if result.returncode != 0:
        log.error("scontrol requeue %s failed (%s): resubmit the job to resume", job, result.stderr.strip())
