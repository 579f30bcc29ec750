from __future__ import annotations

import torch

from olmo_repo import RepoTrainConfig, build_model
from olmo_repo.checkpoint import load_model

from .conftest import tiny_config


def test_load_model_round_trips_a_repo_checkpoint(tmp_path):
    config = RepoTrainConfig(model=tiny_config(pe_mode="repo", pe_start_layer=1))
    model = build_model(config.model)
    config.save(tmp_path / "config.yaml")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    loaded = load_model(tmp_path)
    assert loaded.config == config.model
    ids = torch.randint(0, 100, (2, 16))
    assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)
