"""The position study's from-scratch part (`olmo_repo.experiments.study`) at its smallest size: the recall task says what
it claims, each (arm, seed) is a resumable stage, and its section reports what was measured."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from olmo_repo.errors import RepoError
from olmo_repo.experiments.stages import Stages
from olmo_repo.experiments.study.retrieval import accuracy, build
from olmo_repo.experiments.study.scratch import TESTS, run_scratch, scratch_section
from olmo_repo.experiments.study.study import Study, run_study
from olmo_repo.experiments.study.task import BOS, GRAMMAR_SEED, QUERY, Task, TinyModel


@pytest.mark.parametrize("factor", [1, 4])
def test_every_answer_is_the_value_its_key_had_earlier_among_noise_that_has_a_grammar(factor):
    task = Task().scaled(factor)
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


def test_the_arms_are_rope_nope_and_repo_above_the_lower_third_and_yarn_rescales_only_rotations():
    shape = TinyModel(layers=6)
    modes = {arm: build(arm, shape, 0).config for arm in ("RoPE", "NoPE", "RePo")}
    assert modes["RoPE"].pe_mode == "rope" and modes["NoPE"].pe_mode == "nope"
    assert (modes["RePo"].pe_mode, modes["RePo"].pe_start_layer) == ("repo", 2)
    yarn = build("RePo", shape, 0, yarn=4).config.rope_parameters
    assert yarn["rope_type"] == "yarn" and yarn["factor"] == 4.0
    assert yarn["original_max_position_embeddings"] == shape.task.length
    # the same weights: a YaRN model is the trained one with rescaled rotations
    assert build("RePo", shape, 0).state_dict().keys() == build("RePo", shape, 0, yarn=4).state_dict().keys()


def test_each_model_is_a_stage_a_rerun_keeps_and_the_section_reports_them(tmp_path):
    shape = TinyModel(layers=3, hidden=32, heads=2, mlp=32, steps=2, batch=4, task=Task(length=64))
    folder = Stages(tmp_path / "study", "study")
    results = run_scratch(folder, shape, seeds=(0,), workers=1, sequences=4)
    assert set(results) == {"RoPE-0", "NoPE-0", "RePo-0"}
    for result in results.values():
        for test in TESTS:
            right, scored = result[test]
            assert 0 <= right <= scored == 4 * 8  # 8 queries a sequence
    assert list(results["RePo-0"]["positions"]) == ["1", "2"]  # layers 1..2 of 3
    stages = json.loads((tmp_path / "study" / "stages.json").read_text())
    again = run_scratch(folder, shape, seeds=(0,), workers=1, sequences=4)  # nothing trains: kept as recorded
    assert again == results and json.loads((tmp_path / "study" / "stages.json").read_text()) == stages
    text = scratch_section(results, shape, (0,), sequences=4)
    assert "| RePo |" in text and "4x, YaRN" in text and "seed 0, layer 2" in text
    changed = dataclasses.replace(shape, steps=3)
    assert (
        run_scratch(folder, changed, seeds=(0,), workers=1, sequences=4).keys() == results.keys()
    )  # other inputs: redone
    assert json.loads((tmp_path / "study" / "stages.json").read_text()) != stages


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
    report = run_study(tmp_path / "study", Study(seeds=(0,), scratch=shape), parts=("scratch",))
    text = report.read_text()
    assert not (tmp_path / "study" / "smollm2").exists()
    assert "## SmolLM2-135M continued: the arms\n\n(to come)" in text and "| RePo |" in text
    assert re.search(
        r"^- scratch: [\d-]+ [\d:]+ to [\d-]+ [\d:]+ \(\d+ min this time\), commit \w+", text, re.M
    )
    assert run_study(tmp_path / "study", Study(seeds=(0,), scratch=shape), parts=()).read_text() == text


def test_a_file_for_the_study_s_folder_is_named_as_the_study_s(tmp_path):
    (tmp_path / "mine").write_text("mine")  # it spoke of "the demo's outputs"
    with pytest.raises(
        RepoError, match=rf"^{tmp_path}/mine is a file: pass a folder for the study's outputs$"
    ):
        run_study(tmp_path / "mine", Study(), parts=("scratch",))
    assert (tmp_path / "mine").read_text() == "mine"
