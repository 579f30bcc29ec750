"""The position study's from-scratch part (`olmo_repo.experiments.study`) at its smallest size: the recall task says what
it claims, each (arm, seed) is a resumable stage, and its section reports what was measured."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from olmo_repo.errors import RepoError
from olmo_repo.experiments.stages import Stages, digest
from olmo_repo.experiments.study.retrieval import accuracy, build, train
from olmo_repo.experiments.study.scratch import TEST_SEED, _inputs, jobs, run_scratch, scratch_section
from olmo_repo.experiments.study.study import Study, run_study
from olmo_repo.experiments.study.task import ARMS, BOS, GRAMMAR_SEED, QUERY, TESTS, Task, TinyModel

ARM = {arm.key: arm for arm in ARMS}


@pytest.mark.parametrize("scale", sorted({(length, pairs) for length, pairs, _ in TESTS.values()}))
def test_every_answer_is_the_value_its_key_had_earlier_among_noise_that_has_a_grammar(scale):
    task = Task().scaled(*scale)
    ids, targets, answers = task.batch(torch.Generator().manual_seed(0), 16)
    assert ids.shape == targets.shape == answers.shape == (16, task.length) and (ids[:, 0] == BOS).all()
    k0, v0, n0 = 8, 8 + task.keys, 8 + task.keys + task.values
    follows = torch.randint(
        n0, n0 + task.noise, (task.vocab,), generator=torch.Generator().manual_seed(GRAMMAR_SEED)
    )
    ruled = grammatical = 0
    for row, target, answer in zip(ids.tolist(), targets.tolist(), answers.tolist()):
        scored = [t for t, a in enumerate(answer) if a]
        assert len(scored) == task.queries
        context = row[: 1 + task.length - 1 - 3 * task.queries]
        pairs = {context[t]: context[t + 1] for t in range(1, len(context) - 1) if k0 <= context[t] < v0}
        assert len(pairs) == task.pairs  # distinct keys, each followed by its value
        assert sum(n0 <= x for x in context) == len(context) - 1 - 2 * task.pairs  # the rest is noise
        for t in scored:
            assert row[t - 1] == QUERY and target[t] == pairs[row[t]] == row[t + 1]
        # trained on the answers and on every noise token from the third (the grammar's domain)
        text = [1 <= t < len(row) - 1 and row[t + 1] >= n0 for t in range(len(row))]
        assert target == [row[t + 1] if t in scored or text[t] else -100 for t in range(len(row))]
        domain = [
            t for t in range(2, len(context)) if context[t] >= n0
        ]  # after a pair too: what its key calls for
        ruled += len(domain)
        grammatical += sum(context[t] == follows[context[t - 2]] for t in domain)
    # the grammar holds with probability rule (+ 1 / noise by chance); 6 binomial sd either side
    expected = task.rule + (1 - task.rule) / task.noise
    assert abs(grammatical / ruled - expected) < 6 * (expected * (1 - expected) / ruled) ** 0.5


def test_a_task_too_short_for_its_pairs_is_refused():
    with pytest.raises(ValueError, match="too short"):
        Task(length=24, pairs=8).batch(torch.Generator(), 1)


def test_the_arms_select_their_layers_and_yarn_rescales_only_rotations():
    shape = TinyModel(layers=6)
    modes = {key: build(arm, shape, 0).config for key, arm in ARM.items()}
    assert (modes["rope"].pe_mode, modes["nope"].pe_mode, modes["nope"].pe_start_layer) == ("rope", "nope", 0)
    assert (modes["repo"].pe_mode, modes["repo"].pe_start_layer) == ("repo", 2)
    assert (modes["nope-above"].pe_mode, modes["nope-above"].pe_start_layer) == ("nope", 2)
    yarn = build(ARM["repo"], shape, 0, yarn=4).config.rope_parameters
    assert yarn["rope_type"] == "yarn" and yarn["factor"] == 4.0
    assert yarn["original_max_position_embeddings"] == shape.task.length
    # the same weights: a YaRN model is the trained one with rescaled rotations
    assert (
        build(ARM["repo"], shape, 0).state_dict().keys()
        == build(ARM["repo"], shape, 0, yarn=4).state_dict().keys()
    )


def test_for_one_seed_every_arm_starts_from_the_same_weights_and_f_phi_is_drawn_apart():
    """The matched controls: every tensor two arms share is equal for one seed (HF draws f_phi between the other
    layers' weights, so without the matching 21 of 30 shared tensors differed), f_phi's own differ by seed, and
    another seed draws other weights."""
    shape = TinyModel(hidden=32, heads=2, mlp=32)
    states = {key: build(arm, shape, 3).state_dict() for key, arm in ARM.items()}
    rope = states["rope"]
    for key, state in states.items():
        shared = [name for name in state if name in rope]
        assert len(shared) == len(rope) and all(torch.equal(state[name], rope[name]) for name in shared), key
        extra = {name.rsplit(".", 2)[-2] for name in state if name not in rope}
        assert extra == ({"gate_map", "content_map", "final_map"} if ARM[key].mode == "repo" else set()), key
    f_phi = [name for name in states["repo"] if name not in rope]
    assert all(torch.equal(states["repo"][n], states["repo-lr10"][n]) for n in f_phi)  # knobs: RePo's weights
    assert all(not states["repo-zero"][n].any() for n in f_phi if "final_map" in n)
    other = build(ARM["repo"], shape, 4).state_dict()
    assert not any(torch.equal(other[n], states["repo"][n]) for n in f_phi if "final_map" not in n)
    assert not torch.equal(other["model.embed_tokens.weight"], rope["model.embed_tokens.weight"])


def test_the_knobs_train_f_phi_at_its_rate_and_blend_the_index_then_hand_over():
    """Two steps: f_phi's weights move by about lr x its multiplier (Adam's first step is lr x sign), the other
    weights by about lr; the blended arm ends with p = 0 (scored as trained, f_phi's positions alone)."""
    shape = TinyModel(hidden=32, heads=2, mlp=32, steps=1, batch=2, warmup=1, lr=1e-3)
    start = build(ARM["repo-lr10"], shape, 0).state_dict()
    model, facts = train(ARM["repo-lr10"], shape, 0)
    assert facts["loss"] > 0 and facts["wall_s"] > 0
    # step 0 of 1: the decay factor (steps - step) / (0.2 steps) is 5, clipped to 1: the peak rate
    moved = {n: (p - start[n]).abs().max().item() for n, p in model.state_dict().items()}
    lr = shape.lr
    for name, step in moved.items():
        mult = 10.0 if name.rsplit(".", 2)[-2] in ("gate_map", "content_map", "final_map") else 1.0
        if step:  # Adam's first step is lr x sign(grad), plus weight decay lr x 0.1 x w
            assert step <= mult * lr * (1 + 1e-3) + lr * 0.1 * start[name].abs().max().item(), name
    assert max(moved[n] for n in moved if "final_map" in n) > 5 * lr
    blended, _ = train(ARM["repo-blend"], TinyModel(hidden=32, heads=2, mlp=32, steps=5, batch=2), 0)
    from olmo_repo.rope import repo_layers

    assert [layer.index_blend for layer in repo_layers(blended)] == [0.0, 0.0]


def test_the_longer_arm_trains_its_multiple_of_the_steps_and_starts_as_the_study_s_run():
    """125 steps against 375: the peak rate holds to step 100 in the shorter run, so the first 100 steps' loss on
    the answers is the same to the bit (the same weights, batches and rates); one curve point per 100 steps."""
    shape = TinyModel(hidden=32, heads=2, mlp=32, steps=125, batch=2, warmup=10)
    _, short = train(ARM["repo"], shape, 0)
    _, longer = train(ARM["repo-long"], shape, 0)
    assert len(short["curve"]) == 2 and len(longer["curve"]) == 4
    assert longer["curve"][0] == short["curve"][0] and longer["curve"][1] != short["curve"][1]


def test_an_arm_at_the_study_s_steps_keeps_the_records_made_before_arms_had_steps():
    """The models finished before `Arm.steps` existed stay valid: an arm at the default is digested as then."""
    shape, repo = TinyModel(), ARM["repo"]
    before = {k: v for k, v in dataclasses.asdict(repo).items() if k != "steps"}
    assert _inputs(shape, 200, repo) == digest(
        json.dumps(dataclasses.asdict(shape)), json.dumps(before), json.dumps(TESTS), "200", str(TEST_SEED)
    )
    assert _inputs(shape, 200, ARM["repo-long"]) != _inputs(
        shape, 200, dataclasses.replace(repo, key="repo-long")
    )


def test_the_jobs_go_seed_by_seed_and_each_arm_takes_its_share_of_the_seeds():
    every = jobs(20)
    counts = {key: sum(arm.key == key for arm, _ in every) for key in ARM}
    assert counts == {"repo": 20, "nope-above": 20, "rope": 10, "nope": 10, "repo-lr10": 5, "repo-blend": 5,
                      "repo-zero": 5, "repo-long": 5}  # fmt: skip
    assert [seed for _, seed in every] == sorted(
        seed for _, seed in every
    )  # a study cut short holds whole seeds
    assert len(jobs(2)) == 10


def test_each_model_is_a_stage_a_rerun_keeps_and_the_section_reports_them(tmp_path):
    shape = TinyModel(layers=3, hidden=32, heads=2, mlp=32, steps=2, batch=4, task=Task(length=64))
    folder = Stages(tmp_path / "study", "study")
    reports = []
    results = run_scratch(folder, shape, seeds=2, workers=1, sequences=4, after=lambda: reports.append(1))
    assert set(results) == {f"{arm.key}-{seed}" for arm, seed in jobs(2)} and len(reports) == 10
    for result in results.values():
        for test in TESTS:
            right, scored = result[test]
            assert 0 <= right <= scored == 4 * 8  # 8 queries a sequence
    assert list(results["repo-0"]["positions"]) == ["1", "2"]  # layers 1..2 of 3
    assert all(
        len(r["curve"]) == 1 for r in results.values()
    )  # the answers' loss per 100 steps (2 steps: one)
    # matched: the same weights and batches, so RePo and its control differ by f_phi alone from the first step
    assert results["rope-0"]["loss"] != results["nope-above-0"]["loss"]
    stages = json.loads((tmp_path / "study" / "stages.json").read_text())
    again = run_scratch(folder, shape, seeds=2, workers=1, sequences=4)  # nothing trains: kept as recorded
    assert again == results and json.loads((tmp_path / "study" / "stages.json").read_text()) == stages
    text = scratch_section(results, shape, 2, sequences=4)
    assert "| RePo | 0/2 |" in text and "8x, YaRN" in text and "(vs NoPE in RePo's layers: 0/2)" in text
    assert "(none learned)" in text and "| RePo | 1 | no |" in text
    changed = dataclasses.replace(shape, steps=3)
    assert (
        run_scratch(folder, changed, seeds=2, workers=1, sequences=4).keys() == results.keys()
    )  # other inputs: redone
    assert json.loads((tmp_path / "study" / "stages.json").read_text()) != stages


def test_the_section_ranks_by_learned_share_with_fisher_s_test_and_the_tests_among_those_that_learned():
    """Made-up results (what the section does with them, not a model's): RePo 3 of 4 learned, its control 0 of
    4; the tests among learned models are their means with a t interval over seeds."""
    shape = TinyModel()

    def result(share, longer=0.5, fell=50):  # noqa: E306  (fell: the 100-step block the loss fell under 0.1 in)
        return {"loss": 0.1, "wall_s": 60.0, "load": 2.0, "curve": [1.0] * fell + [0.05] * (50 - fell),
                **{test: [round(1600 * (share if test == "1x" else longer)), 1600] for test in TESTS}}  # fmt: skip

    results = {f"{arm.key}-{seed}": result(0.25) for arm, seed in jobs(4)}
    results.update(
        {"repo-0": result(1.0, 0.4, 10), "repo-1": result(0.95, 0.5, 30), "repo-2": result(0.9, 0.6, 20)}
    )
    text = scratch_section(results, shape, 4)
    # p = C(4,3) C(4,0) / C(8,3) = 4 / 56 = 0.071 (one-sided: 3 or more of the 3 learned in RePo)
    assert "| RePo | 3/4 | 75.0 [30.1, 95.4] | 0.071 (vs NoPE in RePo's layers: 0/4) |" in text
    assert (
        "| RePo | 3 | 2000 [1000, 3000] | 95.0 [82.6, 100.0] | 50.0 [25.2, 74.8] |" in text
    )  # the loss under 0.1 from step: median [min, max]; t(2) 4.303 x sd / sqrt(3), in [0, 100]
    assert "| RePo | 1 | yes |" in text and "| 0.100 | 3000 | 1.0 | 2.0 |" in text  # seed 1's row
    assert "| RoPE | 0 | no |" in text and "| 0.100 | - | 1.0 | 2.0 |" in text  # never under 0.1
    partial = scratch_section({k: v for k, v in results.items() if k != "repo-3"}, shape, 4)
    assert "(**15 of its 16 models so far**)" in partial


def test_accuracy_counts_the_model_s_greedy_answers():
    class Oracle(torch.nn.Module):  # answers every query right: the value that follows its key earlier
        def forward(self, ids):
            logits = torch.zeros(*ids.shape, 200)
            for r, row in enumerate(ids.tolist()):
                for t in range(1, len(row)):
                    if row[t - 1] == QUERY:
                        logits[r, t, row[row.index(row[t]) + 1]] = 1.0
            return type("Out", (), {"logits": logits})

    class Text(torch.nn.Module):  # every next token right but the answers: those are not what it scores
        def forward(self, ids):
            logits = torch.zeros(*ids.shape, 200)
            logits[:, :-1].scatter_(-1, ids[:, 1:, None], 1.0)
            logits[:, 1:][ids[:, :-1] == QUERY] = 0.0
            return type("Out", (), {"logits": logits})

    task = Task()
    assert accuracy(Oracle(), task, 10, seed=3) == (80, 80)
    assert accuracy(Text(), task, 10, seed=3) == (0, 80)


def test_a_stage_command_ended_by_ctrl_c_interrupts_the_recipe_and_a_failure_names_its_log(tmp_path):
    """A terminal's Ctrl-C reaches the stage's command too: its exit by SIGINT (130, or the signal itself) is the
    recipe's (and the study's) interruption, exit 130 and "interrupted", not a failed stage."""
    import signal

    from olmo_repo.errors import RepoError
    from olmo_repo.experiments.smollm2.recipe import _check_exit

    for code in (130, -signal.SIGINT):
        with pytest.raises(KeyboardInterrupt):
            _check_exit(code, "the RoPE run", tmp_path / "run-rope.log")
    with pytest.raises(RepoError, match=rf"^the RoPE run failed \(exit 1\); see {tmp_path}/run-rope.log$"):
        _check_exit(1, "the RoPE run", tmp_path / "run-rope.log")
    _check_exit(0, "the RoPE run", tmp_path / "run-rope.log")


def test_the_study_runs_its_from_scratch_part_alone_and_reports_it_with_its_conditions(tmp_path):
    """`position_study.py --only scratch`: minutes, not the SmolLM2 part's hours; the report shows the part with
    the commit and load it ran at, and the other part as still to come."""
    shape = TinyModel(layers=3, hidden=32, heads=2, mlp=32, steps=2, batch=4, task=Task(length=64))
    report = run_study(tmp_path / "study", Study(seeds=1, scratch=shape, sequences=4), parts=("scratch",))
    text = report.read_text()
    assert not (tmp_path / "study" / "smollm2").exists()
    assert (tmp_path / "study" / "scratch-curves.png").read_bytes()[:4] == b"\x89PNG"
    figure = tmp_path / "study" / "scratch-learned.png"
    assert (
        figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![learned shares](scratch-learned.png)" in text
    )
    assert "## SmolLM2-135M continued: the arms\n\n(to come)" in text and "| RePo |" in text
    assert re.search(
        r"^- scratch: [\d-]+ [\d:]+ to [\d-]+ [\d:]+ \(\d+ min this time\), commit \w+", text, re.M
    )
    assert (
        run_study(tmp_path / "study", Study(seeds=1, scratch=shape, sequences=4), parts=()).read_text()
        == text
    )


def test_a_file_for_the_study_s_folder_is_named_as_the_study_s(tmp_path):
    (tmp_path / "mine").write_text("mine")  # it spoke of "the demo's outputs"
    with pytest.raises(
        RepoError, match=rf"^{tmp_path}/mine is a file: pass a folder for the study's outputs$"
    ):
        run_study(tmp_path / "mine", Study(), parts=("scratch",))
    assert (tmp_path / "mine").read_text() == "mine"


@pytest.mark.parametrize("stop", ["SIGINT", "SIGKILL"])
def test_ctrl_c_or_a_kill_ends_the_from_scratch_part_at_once_and_leaves_no_worker(tmp_path, stop):
    """A terminal's Ctrl-C (SIGINT to the whole process group), or a SIGKILL of the launcher alone, while models
    train: the part ends within seconds, its workers with it, and what finished stays recorded (a pool that
    waited for every queued model kept a 75-model study running after Ctrl-C; orphaned workers trained on)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        # a terminal's foreground job takes Ctrl-C; a pytest-xdist worker ignores SIGINT, which children inherit
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sys; from pathlib import Path\n"
        "from olmo_repo.experiments.study.study import Study, run_study\n"
        "from olmo_repo.experiments.study.task import Task, TinyModel\n"
        "shape = TinyModel(layers=3, hidden=32, heads=2, mlp=32, steps=10**6, batch=4, task=Task(length=64))\n"
        "run_study(Path(sys.argv[1]), Study(seeds=2, scratch=shape, sequences=4), parts=('scratch',))\n"
    )
    study = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "study")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert "models to train" in study.stdout.readline() + study.stdout.readline()
        time.sleep(3)  # the workers start and train
        if stop == "SIGINT":  # Ctrl-C: the whole group
            os.killpg(study.pid, signal.SIGINT)
        else:  # the launcher alone, killed outright: its workers must notice
            os.kill(study.pid, signal.SIGKILL)
        start = time.monotonic()
        output = study.communicate(timeout=60)[0]
        assert time.monotonic() - start < 30 and (stop == "SIGKILL" or "KeyboardInterrupt" in output)
        deadline = (
            time.monotonic() + 15
        )  # multiprocessing's resource tracker follows its parent within seconds
        while time.monotonic() < deadline:
            try:
                os.killpg(study.pid, 0)
            except ProcessLookupError:
                break  # nothing of its group is left
            time.sleep(0.2)
        else:
            raise AssertionError("a process of the study's group outlived it by 15 s")
        records = json.loads((tmp_path / "study" / "stages.json").read_text())
        assert not any(r["done"] for name, r in records.items() if name.startswith("scratch-"))
    finally:
        if study.poll() is None:
            os.killpg(study.pid, signal.SIGKILL)
