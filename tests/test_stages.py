"""The experiments' one stage runner (`olmo_repo.experiments.stages.Stages.run`): a stage runs, is skipped,
resumed or redone from its record, says which in one line, and the report follows every stage that ran."""

from __future__ import annotations

import json

import pytest

from olmo_repo.experiments.stages import Stages


class _Experiment(Stages):
    def __init__(self, path, inputs):
        super().__init__(path, "test", "its stages")
        self.inputs, self.published, self.calls = inputs, 0, []

    def publish(self):
        self.published += 1

    def stage(self, fail: bool = False, resumes: bool = False):
        def work(resume):
            self.calls.append(resume)
            self.entry("out").write_text("partial")
            if fail:
                raise KeyboardInterrupt  # a kill mid-stage: its record says started, not done
            (self.path / "out").write_text("whole")
            return {"wall_s": 1.5}

        def read():
            text = (self.path / "out").read_text()
            if text != "whole":
                raise ValueError(f"out holds {text!r}")
            return text

        return self.run("s", ["out"], work, read, resumes=resumes)


def test_a_stage_runs_once_then_is_skipped_with_its_record(tmp_path, capsys):
    exp = _Experiment(tmp_path / "x", {"s": "a"})
    assert exp.stage() == "whole" and exp.calls == [False] and exp.published == 1 and exp.ran == {"s"}
    assert exp.record("s") == {"inputs": "a", "done": True, "wall_s": 1.5}
    again = _Experiment(tmp_path / "x", {"s": "a"})
    assert again.stage() == "whole" and again.calls == [] and again.published == 0 and again.ran == set()
    assert capsys.readouterr().out.splitlines()[-1] == "== s: finished before with the same inputs, skipped"


@pytest.mark.parametrize("resumes, says", [(True, "resuming"), (False, "redoing")])
def test_an_interrupted_stage_is_resumed_or_redone_and_said(tmp_path, capsys, resumes, says):
    exp = _Experiment(tmp_path / "x", {"s": "a"})
    with pytest.raises(KeyboardInterrupt):
        exp.stage(fail=True)
    assert exp.record("s") == {"inputs": "a", "done": False} and exp.published == 0
    again = _Experiment(tmp_path / "x", {"s": "a"})
    assert again.stage(resumes=resumes) == "whole" and again.calls == [True]  # its partial output kept for it
    assert f"== s: started before and interrupted, {says} it" in capsys.readouterr().out


def test_changed_inputs_or_unreadable_records_redo_the_stage_from_nothing(tmp_path, capsys):
    exp = _Experiment(tmp_path / "x", {"s": "a"})
    exp.stage()
    changed = _Experiment(tmp_path / "x", {"s": "b"})
    assert changed.stage() == "whole" and changed.calls == [False]
    assert json.loads((tmp_path / "x/stages.json").read_text())["s"]["inputs"] == "b"
    (tmp_path / "x/out").write_text("damaged")
    damaged = _Experiment(tmp_path / "x", {"s": "b"})
    assert damaged.stage() == "whole" and damaged.calls == [False]
    out = capsys.readouterr().out
    assert "== s: its recorded results cannot be read (out holds 'damaged'); redoing it" in out
    # recorded(): only what finished with the current inputs
    assert (
        damaged.recorded("s", lambda: 1) == 1
        and _Experiment(tmp_path / "x", {"s": "c"}).recorded("s", lambda: 1) is None
    )


def test_a_users_folder_is_refused_and_only_the_experiments_entries_are_removed(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("mine")
    with pytest.raises(
        Exception, match=r"is not empty and not a previous test's folder: .*writes its stages there"
    ):
        _Experiment(tmp_path / "mine", {"s": "a"})
    exp = _Experiment(tmp_path / "x", {"s": "a"})
    exp.stage()
    (tmp_path / "x/notes.txt").write_text("mine")
    _Experiment(tmp_path / "x", {"s": "b"}).stage()  # redone: "out" replaced, the user's file kept
    assert (tmp_path / "x/notes.txt").read_text() == "mine"
