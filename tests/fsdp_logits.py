"""Run under torchrun by tests/test_train_fsdp.py: the logits of the FSDP model that scripts/train.py builds
and restores from `load_path` (the real build, wrap and checkpointer), for the ids in IDS.pt.

    torchrun --nproc_per_node=2 tests/fsdp_logits.py CONFIG IDS.pt OUT.pt --load_path=... [--key=value ...]
"""

import sys

import torch
import torch.distributed as dist
from olmo.util import clean_opt

from olmo_repo import RepoTrainConfig
from olmo_repo.ai2olmo.preflight import preflight
from olmo_repo.ai2olmo.train import build_trainer, init_distributed
from olmo_repo.upstream.torch import patch_torch_for_olmo

if __name__ == "__main__":
    config, ids_path, out_path, *overrides = sys.argv[1:]
    patch_torch_for_olmo()
    device = init_distributed()
    cfg = RepoTrainConfig.load(config, [clean_opt(o) for o in overrides] + ["dry_run=true"])
    preflight(cfg, cuda=False, world_size=dist.get_world_size())
    with build_trainer(cfg, device) as trainer, torch.no_grad():
        trainer.dist_model.eval()
        logits = trainer.dist_model(torch.load(ids_path)).logits  # [B, T, vocab], every rank
        if dist.get_rank() == 0:
            torch.save(logits, out_path)
    del (
        trainer,
        logits,
    )  # the trainer before the group, every rank's collectives done (tests/test_inloop_niah.py)
    dist.barrier()
    dist.destroy_process_group()
