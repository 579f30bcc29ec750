"""The knobs that let f_phi learn at a small scale (issue 48) on OLMo-core's Trainer, in one gloo process: the
index blend's schedule, f_phi's own learning rate and weight decay (an optimizer group), f_phi alone; the
two-process kill and resume with them is in test_train.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from olmo_core.distributed.utils import get_full_tensor, init_distributed
from olmo_core.train.callbacks import Callback

from olmo_repo.errors import RepoError
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.modes import index_blend, is_f_phi_param
from olmo_repo.olmocore.checks import check_experiment
from olmo_repo.olmocore.hf import hf_to_core
from olmo_repo.olmocore.train import build_trainer, start
from olmo_repo.rope import repo_layers

from .training import metrics, random_corpus, tiny_experiment

pytestmark = pytest.mark.slow  # trains

LR = 3.0e-3  # tiny-stage2-repo.py's
STEPS = 3
KNOBS = (
    "--f_phi.lr_multiplier=3",
    "--f_phi.weight_decay=0.01",  # the base's is 0.1, the embeddings' 0
    "--model.block.sequence_mixer.pe_blend_init=1.0",
    "--model.block.sequence_mixer.pe_blend_steps=4",  # the step-2 checkpoint is mid-anneal: p = 0.5
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One gloo rank, random tokens, the demo's base model as a model-only OLMo-core checkpoint."""
    init_distributed(backend="gloo")
    root = tmp_path_factory.mktemp("knobs")
    yield random_corpus(root / "data"), hf_to_core(BASE_DIR, root / "base")
    torch.distributed.destroy_process_group()


def _trainer(config):
    import olmo_core.distributed.parallel as parallel

    parallel._WORLD_MESH = None  # OLMo-core builds one device mesh per process; these tests build several
    return build_trainer(config)


def _params(trainer) -> dict[str, torch.Tensor]:
    return {k: get_full_tensor(v).clone() for k, v in trainer.train_module.model.state_dict().items()}


@dataclass
class BlendSeen(Callback):
    """What an evaluator callback (priority 0, as OLMo-core's) sees of p: at the start and after each step."""

    seen: list[float] | None = None

    def _record(self) -> None:
        self.seen = [*(self.seen or []), repo_layers(self.trainer.train_module.model)[0].index_blend]

    def pre_train(self) -> None:
        self._record()

    def post_step(self) -> None:
        self._record()


@pytest.fixture(scope="module")
def blended(setup, tmp_path_factory):
    """A run of 3 steps from the base model with `KNOBS` (checkpoints at steps 0, 2, 3), and its trainer."""
    data, base = setup
    run = tmp_path_factory.mktemp("blended") / "run"
    config = tiny_experiment(
        run, data, f"--load_path={base}", f"--trainer.max_duration.value={STEPS}", *KNOBS
    )
    config.trainer = config.trainer.with_callback("blend_seen", BlendSeen())
    check_experiment(config)
    trainer = _trainer(config)
    start(trainer, config)
    trainer.fit()
    return run, config, trainer


def test_blend_schedule_and_f_phi_group_through_a_run_and_its_resume(setup, blended):
    """p is the schedule's for the steps done, before each step (logged) and where in-loop evaluation runs;
    f_phi's group has lr = the schedule's x 3 (exactly: its initial_lr x the schedule) and weight decay 0.01,
    also once a resume has loaded the checkpoint's optimizer; a resume with other f_phi values is refused in
    one line naming both."""
    (data, base), (run, config, trainer) = setup, blended
    assert trainer.callbacks["blend_seen"].seen == [index_blend(1.0, 4, s) for s in range(STEPS + 1)]
    logged, scheduler = metrics(run), config.train_module.scheduler
    for step in range(1, STEPS + 1):
        blend = index_blend(1.0, 4, step - 1)  # the step under way has step - 1 done
        assert logged[step].get("train/positions/index_blend", 0.0) == blend, step
        lrs = [logged[step][f"optim/LR (group {g})"] for g in range(3)]  # embeddings, f_phi, the rest
        assert lrs == [scheduler.get_lr(initial, step, STEPS) for initial in (LR, 3 * LR, LR)], step

    def groups(trainer) -> list[tuple[int, float, float]]:
        return [
            (len(g["params"]), g["initial_lr"], g["weight_decay"])
            for g in trainer.train_module.optim.param_groups
        ]

    rest = sum(1 for _ in trainer.train_module.model.parameters()) - 1 - 9
    want = [(1, LR, 0.0), (9, 3 * LR, 0.01), (rest, LR, 0.1)]
    assert groups(trainer) == want
    more = tiny_experiment(
        run, data, f"--load_path={base}", f"--trainer.max_duration.value={STEPS + 2}", *KNOBS
    )
    resumed = _trainer(more)
    assert start(resumed, more) and resumed.global_step == STEPS
    assert groups(resumed) == want

    other = tiny_experiment(run, data, f"--load_path={base}", *KNOBS, "--f_phi.lr_multiplier=2")
    with pytest.raises(RepoError) as error:
        check_experiment(other)
    says = str(error.value)
    assert says == (  # the ai2-olmo side's words (modes.FPhiTraining.resume_problem)
        f"f_phi.lr_multiplier=2.0, but {run}/step{STEPS} was trained with f_phi.lr_multiplier=3.0: resume with "
        "--f_phi.lr_multiplier=3.0, or train the new value in a new save folder"
    )


def test_f_phi_only_leaves_every_other_weight_bit_identical(setup, tmp_path):
    """`--f_phi.only=true`: FSDP and the optimizer take the frozen weights as such (the optimizer holds f_phi
    alone; the stage-1 start loads the model only); every other weight is bit-identical after two steps while
    f_phi moves."""
    data, base = setup
    config = tiny_experiment(
        tmp_path / "run", data, f"--load_path={base}", "--trainer.max_duration.value=2", "--f_phi.only=true"
    )
    check_experiment(config)
    trainer = _trainer(config)
    start(trainer, config)
    before = _params(trainer)
    trainer.fit()
    after = _params(trainer)
    model = trainer.train_module.model
    trained = {id(p) for g in trainer.train_module.optim.param_groups for p in g["params"]}
    assert trained == {id(p) for n, p in model.named_parameters() if is_f_phi_param(n)} != set()
    for name in before:
        assert torch.equal(before[name], after[name]) != is_f_phi_param(name), name


def test_a_checkpoint_saved_mid_anneal_scores_in_transformers_as_it_trained(blended, tmp_path):
    """The step-2 checkpoint (p = 0.5 of a blend from 1 over 4 steps) converts to an HF config that scores with
    pe_blend = 0.5 and records the schedule; transformers' logits are OLMo-core's at that p in fp32 (within the
    rounding bound), not its p = 0 ones; back to OLMo-core the schedule comes with it (a new run starts it
    again)."""
    from transformers import AutoModelForCausalLM

    import olmo_repo.hf  # noqa: F401  (registers the RePo models with the Auto classes)
    from olmo_repo.olmocore import checkpoint
    from olmo_repo.olmocore.hf import core_to_hf, hf_to_core
    from olmo_repo.rope import set_index_blend

    from .tiny import assert_within, logit_roundings

    run, config, _ = blended
    step = run / "step2"
    assert checkpoint.steps_done(step) == 2
    hf_dir = core_to_hf(step, tmp_path / "hf")
    hf_config = json.loads((hf_dir / "config.json").read_text())
    assert (hf_config["pe_blend"], hf_config["pe_blend_init"], hf_config["pe_blend_steps"]) == (0.5, 1.0, 4)

    model = checkpoint.load_model(step).eval()
    ids = torch.randint(2, 4096, (2, 48))
    with torch.no_grad():
        set_index_blend(model, 0.5)
        want = model(ids)
        set_index_blend(model, 0.0)
        learned = model(ids)
        got = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)(ids).logits
    roundings = 2 * logit_roundings(config.model, 48)
    assert_within(got, want, roundings=roundings, what="logits at p = 0.5")
    with pytest.raises(AssertionError):
        assert_within(got, learned, roundings=roundings, what="logits at p = 0")

    back = checkpoint.model_config(hf_to_core(hf_dir, tmp_path / "core")).block.sequence_mixer
    assert (back.pe_blend_init, back.pe_blend_steps) == (1.0, 4)
