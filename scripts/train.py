"""Train with OLMo's Trainer and the RePo model.

Usage:
    torchrun --nproc_per_node=N scripts/train.py CONFIG [--key=value ...]
    python scripts/train.py CONFIG [--key=value ...]          # one process

CONFIG is a YAML file (configs/*.yaml); each --key=value overrides a config key, dotted for nested keys
(--model.pe_start_layer=5, --save_folder=runs/x, --stop_at=100). The config's strategy (fsdp or ddp) on
nccl with CUDA, on gloo without. Rerunning the same command resumes from the latest checkpoint in
save_folder (or remote_save_folder). See README.md, section "Training".
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    if not Path(sys.argv[1]).is_file():  # before the imports, which take seconds
        sys.exit(
            f"error: config file {sys.argv[1]} does not exist (expected a YAML file such as configs/*.yaml)"
        )
    from olmo_repo.train import train  # after --help: importing torch and OLMo takes seconds

    train(sys.argv[1], sys.argv[2:])
