#!/bin/bash
# The body of the sbatch scripts beside it: one torchrun per node of the job, joined by a rendezvous on the
# job's first node. A YAML config trains with OLMo's Trainer (scripts/train.py, .venv), a Python config of
# configs/olmocore/ with OLMo-core's (scripts/core_train.py, .venv-core). Run from the repository root, inside
# a job:
#   scripts/slurm/launch.sh NPROC_PER_NODE CONFIG [OPTIONS...] [--key=value ...]
# From the environment, when set (arguments win over them): SAVE_FOLDER (both), DATA_PREFIX (ai2-olmo),
# DATA_ROOT and LOAD_PATH (OLMo-core).
#
# SIGUSR1 (sbatch --signal=USR1@SECONDS, or `scancel --signal=USR1 JOBID`) reaches every process of the job:
# torchrun ignores it, the training stops after the current step with a checkpoint and rank 0 requeues the
# job. A kill (preemption, `scontrol requeue`, node failure) requeues a --requeue job too. Either way the
# requeued job runs this again and resumes from the latest checkpoint in the save folder.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NPROC_PER_NODE CONFIG [OPTIONS...] [--key=value ...]" >&2; exit 2; }
[ -f scripts/train.py ] || { echo "$0: run from the repository root (submit with sbatch from there)" >&2; exit 2; }
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] && [ -n "${SLURM_NNODES:-}" ] || {
  echo "$0: runs inside a SLURM job (needs SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_NNODES): submit it with" \
    "sbatch scripts/slurm/*.sbatch; to train without SLURM run scripts/train.py or scripts/core_train.py" >&2
  exit 2
}
nproc=$1 config=$2
shift 2
if [[ $config == *.py ]]; then # OLMo-core
  venv=.venv-core script=scripts/core_train.py
  [ -x $venv/bin/torchrun ] || { echo "$0: .venv-core is missing: run make install-core first" >&2; exit 2; }
  [ -z "${LOAD_PATH:-}" ] || set -- "--load_path=$LOAD_PATH" "$@"
  [ -z "${DATA_ROOT:-}" ] || set -- "--data-root=$DATA_ROOT" "$@"
  [ -z "${SAVE_FOLDER:-}" ] || set -- "--save-folder=$SAVE_FOLDER" "$@"
else # ai2-olmo
  venv=.venv script=scripts/train.py
  [ -z "${SAVE_FOLDER:-}" ] || set -- "--save_folder=$SAVE_FOLDER" "$@"
  [ -z "${DATA_PREFIX:-}" ] || set -- "--data_prefix=$DATA_PREFIX" "$@"
fi

echo "$(date '+%F %T') job $SLURM_JOB_ID, start $((${SLURM_RESTART_COUNT:-0} + 1)), nodes $SLURM_JOB_NODELIST:" \
  "$config $*"

# Check the run once, for the whole job, before any node starts (a bad input is one line here, not one per rank
# and torchrun's traceback); a requeued job was checked at its first start, and its ranks check again.
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  $venv/bin/python $script --check --nnodes="$SLURM_NNODES" --nproc-per-node="$nproc" "$config" "$@"
fi

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((15000 + SLURM_JOB_ID % 15000)) # below the ephemeral range; jobs sharing a node differ

# srun does not pass sbatch's --cpus-per-task on to the step (SLURM >= 22.05): say it again.
srun --kill-on-bad-exit=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  bash -c 'trap "" USR1 && exec "$@"' torchrun $venv/bin/torchrun \
  --nnodes="$SLURM_NNODES" --nproc_per_node="$nproc" \
  --rdzv_backend=c10d --rdzv_endpoint="$head_node:$port" --rdzv_id="$SLURM_JOB_ID" \
  $script "$config" "$@"
