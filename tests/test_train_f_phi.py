"""Learning positions on ai2-olmo's trainer (issue 48), in this process on the tiny configs: the index blend's p
on every step, evaluation and restore; f_phi's own learning rate and weight decay (a param group of its own,
exact against the schedule times the multiplier, also right after a restore); f_phi alone; a resume with other
`f_phi` values refused. The kill-and-resume of a real process is tests/test_train_cli.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from olmo.exceptions import OLMoConfigurationError
from olmo.optim import build_scheduler

from olmo_repo import RepoTrainConfig
from olmo_repo.ai2olmo.trainer import F_PHI_GROUP
from olmo_repo.modes import INDEX_BLEND_METRIC, index_blend, is_f_phi_param
from olmo_repo.rope import repo_layers

from .training import STAGE1, make_trainer, small, write_corpus

MULTIPLIER, F_PHI_DECAY = (
    10.0,
    0.01,
)  # the base's weight decay is 0.1 (tiny-stage1-rope.yaml): a restore resets it
KNOBS = {
    "model.pe_mode": "repo",
    "model.pe_start_layer": 1,
    "model.pe_blend_init": 1.0,
    "model.pe_blend_steps": 4,
    "f_phi.lr_multiplier": MULTIPLIER,
    "f_phi.weight_decay": F_PHI_DECAY,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("f_phi") / "data", n_tokens=4_000)


def _overrides(data: Path, folder: Path, **extra: object) -> list[str]:
    steps = dict(max_duration=6, stop_at=6, save_interval_unsharded=3, no_pre_train_checkpoint="true")
    return small(data, folder, **{**steps, **KNOBS, **extra})


def _f_phi_group(trainer) -> dict:
    (group,) = [g for g in trainer.optim.param_groups if F_PHI_GROUP in g]
    return group


def _schedule(trainer, step: int) -> float:
    """The base lr of `step` (1-based, as OLMo's Trainer counts the step it runs), from a scheduler of its own."""
    cfg = trainer.cfg
    return build_scheduler(cfg).get_lr(cfg.optimizer.learning_rate, step, trainer.max_steps)


def _records(folder: Path) -> dict[int, dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "train/CrossEntropyLoss" in r}


@pytest.mark.slow
def test_lr_weight_decay_and_index_blend_hold_on_every_step_and_across_a_restore(data, tmp_path, device):
    """Each step's lr of every group exact (the schedule's; f_phi's times 10), warm-up and decay included; the
    weight decay f_phi's own (0.01, the base's 0.1); the index blend's p that of the steps completed, on every
    step and evaluation; all of it right after a restore too (OLMo's resets every group's lr and weight decay).
    A resume with other `f_phi` values is refused in one line naming both."""
    run = tmp_path / "run"
    with make_trainer(STAGE1, _overrides(data, run, stop_at=3), device) as trainer:
        names = {n for g in trainer.optim.param_groups for n in g["param_names"]}
        assert len(trainer.optim.param_groups) == 3  # decay, no-decay, f_phi's
        assert sorted(_f_phi_group(trainer)["param_names"]) == sorted(n for n in names if is_f_phi_param(n))
        assert len(_f_phi_group(trainer)["param_names"]) == 3 * 2  # 3 weights in layers 1 and 2
        layers = repo_layers(trainer.model)
        assert len(layers) == 2 and all(layer.index_blend == 1.0 for layer in layers)  # step 0
        trainer.fit()  # its last step evaluates: p after 3 steps
        assert all(layer.index_blend == index_blend(1.0, 4, 3) == 0.25 for layer in layers)

    with pytest.raises(OLMoConfigurationError) as error:
        make_trainer(STAGE1, _overrides(data, run, **{"f_phi.weight_decay": "null"}), device)
    assert str(error.value) == (
        f"f_phi.weight_decay=null, but {run}/step3-unsharded was trained with f_phi.weight_decay=0.01: resume "
        f"with --f_phi.weight_decay=0.01, or train the new value in a new save folder (--load_path={run}/"
        "step3-unsharded --reset_optimizer_state=true starts from that checkpoint)"
    )

    with make_trainer(STAGE1, _overrides(data, run), device) as trainer:  # resumes at step 3
        assert trainer.global_step == 3
        f_phi, (decay, no_decay) = _f_phi_group(trainer), trainer.optim.param_groups[:2]
        # What OLMo's restore gives every group (the schedule at scheduler_current), times 10 for f_phi's.
        assert decay["lr"] == _schedule(trainer, 3) and f_phi["lr"] == _schedule(trainer, 3) * MULTIPLIER
        assert (decay["weight_decay"], no_decay["weight_decay"], f_phi["weight_decay"]) == (
            0.1,
            0.0,
            F_PHI_DECAY,
        )
        assert all(layer.index_blend == 0.25 for layer in repo_layers(trainer.model))
        trainer.fit()
    records = _records(run)
    assert sorted(records) == list(range(1, 7))
    for step, record in records.items():
        base = _schedule(trainer, step)
        lrs = [record[f"optim/learning_rate_group{i}"] for i in range(3)]
        assert lrs == [base, base, base * MULTIPLIER], step
    assert len({r["optim/learning_rate_group0"] for r in records.values()}) == 6  # warm-up, then decay
    saved = torch.load(run / "step6-unsharded/optim.pt", weights_only=False)["param_groups"]
    assert [g["weight_decay"] for g in saved] == [0.1, 0.0, F_PHI_DECAY]
    # Step s trains with p after s - 1 steps: 1, 0.75, 0.5, 0.25, then 0 (not logged once the blend is off).
    logged = {step: r.get(INDEX_BLEND_METRIC) for step, r in records.items()}
    assert logged == {1: 1.0, 2: 0.75, 3: 0.5, 4: 0.25, 5: None, 6: None}


@pytest.mark.slow
def test_f_phi_only_moves_f_phi_and_leaves_every_other_weight_bit_identical(data, tmp_path, device):
    overrides = _overrides(data, tmp_path / "run", stop_at=2, **{"f_phi.only": "true"})
    with make_trainer(STAGE1, overrides, device) as trainer:
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.fit()
        after = dict(trainer.model.named_parameters())
    f_phi = {n for n in before if is_f_phi_param(n)}
    assert len(f_phi) == 6 and len(before) > 20
    assert all(not torch.equal(before[n], after[n]) for n in f_phi)
    assert all(torch.equal(before[n], after[n]) for n in before.keys() - f_phi)
    # Its optimizer state (f_phi alone, in a group of its own) does not fit a run that trains every weight.
    checkpoint = tmp_path / "run/step2-unsharded"
    with pytest.raises(OLMoConfigurationError) as error:
        make_trainer(STAGE1, small(data, tmp_path / "next", **{**KNOBS, "load_path": checkpoint}), device)
    assert str(error.value) == (
        f"load_path={checkpoint} holds an optimizer state with a param group of f_phi's own, the rest frozen "
        "(f_phi: lr_multiplier=10.0, weight_decay=0.01, only=true), this run's has a param group of f_phi's own "
        "(f_phi: lr_multiplier=10.0, weight_decay=0.01, only=false): pass --reset_optimizer_state=true to start "
        "the optimizer fresh"
    )
    assert not (tmp_path / "next").exists()


@pytest.mark.slow
def test_a_checkpoint_saved_mid_anneal_scores_in_hf_as_training_did_at_its_step(data, tmp_path, device):
    """Saved after 2 of the blend's 4 steps (p = 0.5), converted: the HF model (transformers, this project's
    modeling) records the schedule and p, and gives the logits the trained OLMo model gave at that step, within
    fp32 bounds (not p = 0's: a conversion that dropped p fails); back to OLMo, the schedule comes along."""
    from transformers import AutoModelForCausalLM

    import olmo_repo.hf  # noqa: F401  (registers the RePo configs with the Auto classes)
    from olmo_repo.ai2olmo.hf import convert_from_hf, convert_to_hf
    from olmo_repo.rope import set_index_blend

    from .numerics import assert_within, model_roundings

    run = tmp_path / "run"
    overrides = _overrides(data, run, max_duration=4, stop_at=2, save_interval_unsharded=2)
    with make_trainer(STAGE1, overrides, device) as trainer:
        trainer.fit()
        olmo = trainer.model.eval()
    hf_dir = convert_to_hf(run / "step2-unsharded", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert (hf.config.pe_blend, hf.config.pe_blend_init, hf.config.pe_blend_steps) == (0.5, 1.0, 4)
    ids = torch.randint(2, 128, (2, 32))
    roundings = 2 * model_roundings(olmo.config, 32)
    with torch.no_grad():
        got = hf(ids).logits
        assert_within(got, olmo(ids).logits, roundings=roundings, what="HF logits at p = 0.5")
        set_index_blend(olmo, 0.0)
        with pytest.raises(AssertionError, match="exceeds the bound"):
            assert_within(got, olmo(ids).logits, roundings=roundings)
    back = RepoTrainConfig.load(convert_from_hf(hf_dir, tmp_path / "back") / "config.yaml").model
    assert (back.pe_blend_init, back.pe_blend_steps) == (1.0, 4)


NO_ANNEAL = (  # the same words on OLMo-core (tests/core/test_bad_input.py)
    "model.pe_blend_steps=0 is no blend (p is 0 from step 0): set model.pe_blend_steps to the steps over which p "
    "falls to 0, or model.pe_blend_init=0"
)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"model.pe_blend_init": 1.5}, "model.pe_blend_init=1.5 is not a blend weight; allowed: a number in [0, 1]"),
        ({"model.pe_blend_steps": -1}, "model.pe_blend_steps=-1 is not a step count; allowed: a whole number >= 0 (0: no blend)"),
        ({"model.pe_blend_init": 1, "model.pe_blend_steps": 0}, f"model.pe_blend_init=1.0 with {NO_ANNEAL}"),
        ({"f_phi.lr_multiplier": 0}, "f_phi.lr_multiplier=0.0; allowed: a finite number > 0 (1: the schedule's lr)"),
        ({"f_phi.lr_multiplier": "inf"}, "f_phi.lr_multiplier=inf; allowed: a finite number > 0 (1: the schedule's lr)"),
        (
            {"model.pe_mode": "nope", "f_phi.only": "true", "model.pe_blend_init": 0},
            "f_phi.only=true trains f_phi alone, but this model has no RePo layer (no f_phi): set pe_mode=repo, or only=false",
        ),
    ],
)  # fmt: skip
def test_bad_values_are_one_line_at_load(data, tmp_path, extra, message):
    with pytest.raises(OLMoConfigurationError) as error:
        RepoTrainConfig.load(STAGE1, _overrides(data, tmp_path / "run", **extra))
    assert str(error.value) == message
