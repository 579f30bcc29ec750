"""Strict stage-1 initialisation (`olmo_repo.olmocore.stage1`), in one gloo process (OLMo-core's FSDP over one
rank); the two-process runs are in test_train.py."""

from __future__ import annotations

import logging

import pytest
import torch
from olmo_core.distributed.checkpoint import save_model_and_optim_state
from olmo_core.distributed.utils import get_full_tensor, init_distributed

from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.fit import CheckpointFitError, f_phi_layer
from olmo_repo.modes import F_PHI_WEIGHTS, POSITION_STATS
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.attention import with_position_modes
from olmo_repo.olmocore.checks import check_experiment
from olmo_repo.olmocore.hf import hf_to_core
from olmo_repo.olmocore.stage1 import check_stage1
from olmo_repo.olmocore.train import build_trainer, start

from .. import fit_table
from .tiny import olmo2_tiny
from .training import build_corpus, metrics, tiny_experiment


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One gloo rank, the demo's corpus (small) and its base model as a model-only OLMo-core checkpoint."""
    init_distributed(backend="gloo")
    root = tmp_path_factory.mktemp("stage1")
    yield build_corpus(root / "data"), hf_to_core(BASE_DIR, root / "base")
    torch.distributed.destroy_process_group()


def _trainer(config):
    """`build_trainer`; OLMo-core builds its device mesh once per process (a training script builds one
    trainer), these tests build several in one process."""
    import olmo_core.distributed.parallel as parallel

    parallel._WORLD_MESH = None
    return build_trainer(config)


def _params(trainer) -> dict[str, torch.Tensor]:
    return {
        k: get_full_tensor(v).detach().clone() for k, v in trainer.train_module.model.state_dict().items()
    }


def _optim_state(trainer) -> dict[str, dict[str, torch.Tensor]]:
    model, optim = trainer.train_module.model, trainer.train_module.optim
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: {k: get_full_tensor(v).clone() for k, v in s.items()} for p, s in optim.state.items()
    }


def test_base_loads_bit_exact_and_repo_weights_keep_their_init(setup, tmp_path):
    data, base = setup
    stock = checkpoint.state_dict(checkpoint.load_model(base))
    config = tiny_experiment(tmp_path / "run", data, f"--load_path={base}")
    check_experiment(config)
    trainer = _trainer(config)
    trainer.train_module.model.init_weights(max_seq_len=512)
    before = _params(trainer)
    start(trainer, config)
    after = _params(trainer)
    new = {k for k in after if f_phi_layer(k) is not None}
    assert new == {f"blocks.{i}.attention.{n}.weight" for i in (1, 2, 3) for n in F_PHI_WEIGHTS}
    for name, tensor in after.items():
        if name in new:
            assert torch.equal(tensor, before[name]), name  # the init, untouched
        else:
            assert torch.equal(tensor, stock[name].float()), name  # bf16 base, exactly upcast


def test_stage1_optimizer_state_continues_for_the_base(setup, tmp_path):
    """A RoPE run's checkpoint with AdamW state: every base parameter's exp_avg, exp_avg_sq and step continue,
    the RePo parameters start fresh, the optimizer's hyper-parameters are the new run's."""
    data, base = setup
    rope = tiny_experiment(tmp_path / "rope", data, f"--load_path={base}")
    rope.model = with_position_modes(rope.model, "rope")
    trainer = _trainer(rope)
    start(trainer, rope)
    batch = {"input_ids": torch.randint(2, 4096, (2, 512))}
    trainer.train_module.train_batch(batch)
    trainer.train_module.optim_step()
    stage1 = tmp_path / "stage1"
    save_model_and_optim_state(
        stage1 / "model_and_optim",
        trainer.train_module.model,
        trainer.train_module.optim,
        flatten_optimizer_state=True,
    )
    saved = _optim_state(trainer)

    repo = tiny_experiment(tmp_path / "repo", data, f"--load_path={stage1}", "--train_module.optim.lr=1e-4")
    trainer = _trainer(repo)
    start(trainer, repo)
    state = _optim_state(trainer)
    for name, moments in state.items():
        if f_phi_layer(name) is not None:
            assert moments["exp_avg"].abs().max() == 0 and moments["exp_avg_sq"].abs().max() == 0, name
        else:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(moments[key], saved[name][key]), (name, key)
    assert {g["lr"] for g in trainer.train_module.optim.param_groups} == {1e-4}


def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_is_written(setup, tmp_path):
    data, base = setup
    source = tmp_path / "source"
    model = olmo2_tiny("repo", 2)
    checkpoint.save_model(model.build(init_device="cpu"), {"model": model.as_config_dict()}, source)
    config = tiny_experiment(tmp_path / "run", data, f"--load_path={source}")
    with pytest.raises(
        CheckpointFitError, match=rf"^load_path={source} does not fit the model of this config: "
    ):
        check_experiment(config)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", fit_table.CASES, ids=lambda case: case.name)
def test_the_fit_table(case, tmp_path):
    """tests/fit_table.py, which tests/test_stage1_init.py runs on ai2-olmo: the same answer to the same input."""
    source = olmo2_tiny(**case.checkpoint).build(init_device="cpu")
    if case.drop:
        layer, weight = case.drop
        delattr(source.blocks[str(layer)].attention, weight)
    checkpoint.save_model(source, {}, tmp_path)
    config = olmo2_tiny(**case.config)
    if case.new_layers is None:
        with pytest.raises(CheckpointFitError, match=fit_table.message(case, _key)) as error:
            check_stage1(str(tmp_path), config)
        assert str(error.value).startswith(f"load_path={tmp_path} does not fit the model of this config: ")
    else:
        check_stage1(str(tmp_path), config)  # accepted


def _key(layer: int, weight: str) -> str:
    return f"model.blocks.{layer}.attention.{weight}.weight"


@pytest.mark.slow  # trains
def test_positions_are_logged_per_repo_layer(setup, tmp_path, caplog):
    data, base = setup
    config = tiny_experiment(tmp_path / "run", data, f"--load_path={base}", "--trainer.max_duration.value=2")
    trainer = _trainer(config)
    with caplog.at_level(logging.INFO):
        start(trainer, config)
        trainer.fit()
    assert f"Initialising from {base}" in caplog.text
    assert "will train from scratch" not in caplog.text  # OLMo-core's fit, looking for a checkpoint again
    logged = metrics(tmp_path / "run")
    for step in (1, 2):
        names = {k for k in logged[step] if k.startswith("train/positions/")}
        assert names == {f"train/positions/layer{i}/{s}" for i in (1, 2, 3) for s in POSITION_STATS}
        assert logged[step]["train/positions/layer1/min"] <= logged[step]["train/positions/layer1/max"]


@pytest.mark.slow  # trains
def test_sigusr1_stops_after_the_current_step_with_a_checkpoint(setup, tmp_path):
    """What SLURM's `--signal=USR1@...` does to a run: it stops after the step it is in, with a checkpoint."""
    import os
    import signal
    from dataclasses import dataclass

    from olmo_core.train.callbacks import Callback

    @dataclass
    class SignalAtStep2(Callback):
        def post_step(self) -> None:
            if self.step == 2:
                os.kill(os.getpid(), signal.SIGUSR1)

    data, base = setup
    config = tiny_experiment(tmp_path / "run", data, f"--load_path={base}", "--trainer.max_duration.value=6")
    config.trainer = config.trainer.with_callback("signal", SignalAtStep2())
    trainer = _trainer(config)
    start(trainer, config)
    trainer.fit()
    step = trainer.global_step
    assert trainer.callbacks["signal_stop"].stopped and 2 <= step < 6  # at the next cancel check
    assert (tmp_path / "run" / f"step{step}").is_dir() and not (tmp_path / "run" / "step6").exists()


@pytest.mark.slow  # trains
def test_inloop_niah_scores_the_base_model_under_todays_metric_names(setup, tmp_path):
    """The demo's base model retrieves the corpus's NIAH variants (niah_single_1: "seen") perfectly at 512
    tokens: OLMo-core's evaluator over the ai2-olmo side's rows and metric says so, under its metric names."""
    data, base = setup
    config = tiny_experiment(
        tmp_path / "run",
        data,
        f"--load_path={base}",
        "--trainer.max_duration.value=1",
        "--trainer.callbacks.niah.enabled=true",
        "--trainer.callbacks.niah.prompts=4",
        "--trainer.callbacks.niah.variants=[niah_single_1,niah_multikey_2]",
    )
    config.model = with_position_modes(config.model, "rope")
    trainer = _trainer(config)
    start(trainer, config)
    trainer.fit()
    logged = metrics(tmp_path / "run")[0]
    assert {k for k in logged if k.startswith("eval/")} == {
        "eval/niah_single_1/exact_match",
        "eval/niah_single_1/logprob",
        "eval/niah_multikey_2/exact_match",
        "eval/niah_multikey_2/logprob",
        "eval/niah_multikey_2/rank_acc",
    }
    assert logged["eval/niah_single_1/exact_match"] == 1.0 and logged["eval/niah_single_1/logprob"] > -0.5
    again = _trainer(config)  # the same command once more: a finished run is left alone
    assert not start(again, config) and again.global_step == 1
