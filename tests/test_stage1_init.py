"""Stage-1 initialisation through the real Trainer and checkpointer (one-process gloo group, DDP on CPU)."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import shutil
import threading

import pytest
import torch
from olmo.config import ModelConfig, TrainConfig
from olmo.exceptions import OLMoCheckpointError, OLMoConfigurationError

from olmo_repo import RepoTrainConfig, build_model
from olmo_repo.ai2olmo.stage1 import check_stage1_state_dict, continue_optimizer_state, repo_param_names
from olmo_repo.fit import CheckpointFitError
from olmo_repo.modes import F_PHI_WEIGHTS

from . import fit_table
from .conftest import tiny_config
from .training import STAGE1, STAGE2_REPO, make_trainer, small, write_corpus


@pytest.fixture(scope="module")
def stage1(tmp_path_factory, device):
    """A stage-1 RoPE checkpoint after 3 steps (so its optimizer state is not trivial), and the data."""
    root = tmp_path_factory.mktemp("stage1")
    data = write_corpus(root / "data")
    overrides = small(data, root / "run", max_duration=3, stop_at=3, save_interval_unsharded=3)
    with make_trainer(STAGE1, overrides + ["no_pre_train_checkpoint=true"], device) as trainer:
        trainer.fit()
    return root / "run/step3-unsharded", data


def _stage1_optim_by_name(checkpoint) -> dict[str, dict]:
    osd = torch.load(checkpoint / "optim.pt", weights_only=True)
    return {
        name.removeprefix("module."): osd["state"][pid]
        for g in osd["param_groups"]
        for pid, name in zip(g["params"], g["param_names"])
    }


@pytest.mark.slow
def test_stage1_init_bit_exact_with_optimizer_surgery(stage1, tmp_path, device):
    checkpoint, data = stage1
    stage1_weights = torch.load(checkpoint / "model.pt", weights_only=True)
    stage1_optim = _stage1_optim_by_name(checkpoint)
    overrides = small(data, tmp_path / "a", load_path=checkpoint, max_duration=2, stop_at=2)
    with make_trainer(STAGE2_REPO, overrides, device) as trainer:
        weights = trainer.model.state_dict()
        repo = repo_param_names(trainer.cfg.model)
        assert repo == {
            f"transformer.blocks.{i}.{m}.weight"
            for i in (1, 2)
            for m in ("gate_map", "content_map", "final_map")
        }
        assert set(weights) - set(stage1_weights) == repo and not set(stage1_weights) - set(weights)
        for key, tensor in stage1_weights.items():
            assert torch.equal(weights[key], tensor), key
        by_name = {
            n.removeprefix("module."): p
            for g in trainer.optim.param_groups
            for n, p in zip(g["param_names"], g["params"])
        }
        for name, param in by_name.items():
            state = trainer.optim.state.get(param, {})
            if name in repo:
                assert not state, name
            else:
                for k in ("exp_avg", "exp_avg_sq", "step"):
                    assert torch.equal(state[k], stage1_optim[name][k]), (name, k)
        repo_init = {k: weights[k].clone() for k in repo}
        trainer.fit()  # two steps: base parameters continue at step 3 + 2, RePo parameters start at 0 + 2
        for name, param in by_name.items():
            assert trainer.optim.state[param]["step"].item() == (2 if name in repo else 5), name

    # The RePo weights the load kept are the fresh init of the same seed without any checkpoint.
    fresh_overrides = small(data, tmp_path / "b", no_pre_train_checkpoint=True)
    with make_trainer(STAGE2_REPO, fresh_overrides, device) as fresh:
        fresh_weights = fresh.model.state_dict()
        for key, tensor in repo_init.items():
            assert torch.equal(tensor, fresh_weights[key]), key


@pytest.mark.slow
def test_f_phi_only_from_stage1_leaves_the_frozen_weights_optimizer_state_out(stage1, tmp_path, device):
    """`f_phi.only` from a stage-1 checkpoint, as the paper's arm starts: no reset needed (the frozen weights'
    stage-1 state is left out, nothing trains them), f_phi alone in the optimizer (its own lr), fresh; after
    two steps every stage-1 weight is still bit for bit the checkpoint's."""
    checkpoint, data = stage1
    knobs = {"f_phi.only": "true", "f_phi.lr_multiplier": 10}
    overrides = small(data, tmp_path / "a", load_path=checkpoint, max_duration=2, stop_at=2, **knobs)
    with make_trainer(STAGE2_REPO, overrides, device) as trainer:
        names = {n.removeprefix("module.") for g in trainer.optim.param_groups for n in g["param_names"]}
        assert names == repo_param_names(trainer.cfg.model) and not trainer.optim.state
        trainer.fit()
        weights = trainer.model.state_dict()
    stage1_weights = torch.load(checkpoint / "model.pt", weights_only=True)
    assert all(torch.equal(weights[k], v) for k, v in stage1_weights.items())


@pytest.mark.slow
def test_reset_optimizer_state_and_weights_only_directory(stage1, tmp_path, device):
    checkpoint, data = stage1
    # Weights converted from elsewhere: model.pt and a stock config.yaml, no optim.pt/train.pt, no -unsharded name.
    converted = tmp_path / "converted"
    converted.mkdir()
    shutil.copy(checkpoint / "model.pt", converted / "model.pt")
    stage1_model = RepoTrainConfig.load(checkpoint / "config.yaml", validate_paths=False).model
    stock_model = ModelConfig(
        **{f.name: getattr(stage1_model, f.name) for f in dataclasses.fields(ModelConfig)}
    )
    TrainConfig(model=stock_model).save(converted / "config.yaml")

    with pytest.raises(OLMoCheckpointError, match="has no optim.pt: pass --reset_optimizer_state=true"):
        make_trainer(STAGE2_REPO, small(data, tmp_path / "a", load_path=converted), device)
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())  # nothing written
    with pytest.raises(OLMoCheckpointError, match="has no train.pt: pass --reset_trainer_state=true"):
        make_trainer(
            STAGE2_REPO, small(data, tmp_path / "a", load_path=converted, reset_optimizer_state=True), device
        )
    # The corrected command in the same save_folder.
    overrides = small(
        data, tmp_path / "a", load_path=converted, reset_optimizer_state=True, reset_trainer_state=True
    )
    with make_trainer(STAGE2_REPO, overrides, device) as trainer:
        assert not trainer.optim.state
        stage1_weights = torch.load(converted / "model.pt", weights_only=True)
        weights = trainer.model.state_dict()
        assert all(torch.equal(weights[k], v) for k, v in stage1_weights.items())


@pytest.mark.slow
def test_bad_checkpoint_fails_through_the_trainer(stage1, tmp_path, device):
    checkpoint, data = stage1
    broken = tmp_path / "broken-unsharded"
    shutil.copytree(checkpoint, broken)
    weights = torch.load(broken / "model.pt", weights_only=True)
    del weights["transformer.blocks.0.ff_proj.weight"]
    torch.save(weights, broken / "model.pt")
    with pytest.raises(
        CheckpointFitError,
        match=rf"^load_path={broken} does not fit .* not f_phi weights: transformer\.blocks\.0\.ff_proj\.weight",
    ):
        make_trainer(STAGE2_REPO, small(data, tmp_path / "a", load_path=broken), device)


@pytest.mark.parametrize("case", fit_table.CASES, ids=lambda case: case.name)
def test_the_fit_table(case):
    """tests/fit_table.py, which tests/core/test_stage1.py runs on OLMo-core: the same answer to the same input."""
    source = build_model(tiny_config(**case.checkpoint)).state_dict()
    if case.drop:
        del source[fit_table_key(*case.drop)]
    config = tiny_config(**case.config)
    if case.new_layers is None:
        with pytest.raises(CheckpointFitError, match=fit_table.message(case, fit_table_key)) as error:
            check_stage1_state_dict(source, config, "load_path=ckpt")
        assert str(error.value).startswith("load_path=ckpt does not fit the model of this config: ")
    else:
        new = check_stage1_state_dict(source, config, "load_path=ckpt")
        assert new == {fit_table_key(i, w) for i in case.new_layers for w in F_PHI_WEIGHTS}


def fit_table_key(layer: int, weight: str) -> str:
    return f"transformer.blocks.{layer}.{weight}.weight"


@pytest.mark.slow
def test_stage1_init_from_an_http_url(stage1, tmp_path, device):
    checkpoint, data = stage1
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(checkpoint.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{checkpoint.name}/"
    try:
        with make_trainer(STAGE2_REPO, small(data, tmp_path / "a", load_path=url), device) as trainer:
            weights = trainer.model.state_dict()
            stage1_weights = torch.load(checkpoint / "model.pt", weights_only=True)
            assert all(torch.equal(weights[k], v) for k, v in stage1_weights.items())
            assert len(trainer.optim.state) == len(stage1_weights)  # base parameters only
    finally:
        server.shutdown()


@pytest.mark.slow
def test_stage1_optimizer_saved_by_fsdp_is_continued(stage1, tmp_path, device):
    """OLMo-2's released stage-1 optim.pt comes from FSDP: state and params keyed by parameter name."""
    checkpoint, data = stage1
    fsdp_style = tmp_path / "fsdp-step3-unsharded"
    shutil.copytree(checkpoint, fsdp_style)
    by_name = _stage1_optim_by_name(checkpoint)
    osd = torch.load(checkpoint / "optim.pt", weights_only=True)
    for group in osd["param_groups"]:
        group["params"] = group["param_names"] = [n.removeprefix("module.") for n in group["param_names"]]
    osd["state"] = by_name
    torch.save(osd, fsdp_style / "optim.pt")
    with make_trainer(STAGE2_REPO, small(data, tmp_path / "a", load_path=fsdp_style), device) as trainer:
        repo = repo_param_names(trainer.cfg.model)
        for group in trainer.optim.param_groups:
            for name, param in zip(group["param_names"], group["params"]):
                name = name.removeprefix("module.")
                state = trainer.optim.state.get(param, {})
                assert (
                    not state
                    if name in repo
                    else torch.equal(state["exp_avg_sq"], by_name[name]["exp_avg_sq"])
                )
        # What FSDP.optim_state_dict_to_load gets on GPU: the same surgery, keyed by parameter name.
        surgery = continue_optimizer_state(osd, trainer.optim, repo, by_name=True)
    assert set(surgery["state"]) == set(by_name) and not set(surgery["state"]) & repo
    assert {n for g in surgery["param_groups"] for n in g["params"]} == set(by_name) | repo


@pytest.mark.slow
def test_a_folder_without_checkpoint_is_a_new_run(stage1, tmp_path, device):
    """A run that failed or was killed before its first save left only its config and data order: the same
    command starts again, and so does a corrected one; a config.yaml that no run here wrote is refused."""
    checkpoint, data = stage1
    overrides = small(data, tmp_path / "run", load_path=checkpoint)
    make_trainer(STAGE2_REPO, overrides, device).close()
    assert (tmp_path / "run/config.yaml").is_file() and not list((tmp_path / "run").glob("step*"))
    make_trainer(STAGE2_REPO, overrides, device).close()
    with make_trainer(STAGE2_REPO, overrides + ["seed=7"], device) as trainer:
        assert trainer.cfg.seed == 7
    assert "seed: 7" in (tmp_path / "run/config.yaml").read_text()

    foreign = small(data, tmp_path / "mine", load_path=checkpoint)
    (tmp_path / "mine").mkdir()
    shutil.copy(STAGE2_REPO, tmp_path / "mine/config.yaml")  # e.g. the user's own config file
    with pytest.raises(OLMoConfigurationError, match="config.yaml exists and was not written by a run"):
        make_trainer(STAGE2_REPO, foreign, device)
    assert (tmp_path / "mine/config.yaml").read_text() == STAGE2_REPO.read_text()
