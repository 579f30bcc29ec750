"""The demo's command line and output folder: a real --help, a user's folder is never emptied."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from olmo_repo.demo import DemoFolder, positions_summary

from .conftest import ROOT

DEMO = ROOT / "scripts/demo.py"


def test_help_explains_the_folder_and_starts_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, str(DEMO), "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: demo.py [-h] [OUT_DIR]")
    assert "previous demo's, whose outputs are replaced" in " ".join(result.stdout.split())
    assert not any(tmp_path.iterdir())  # no folder named --help


def test_a_users_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = subprocess.run([sys.executable, str(DEMO), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (
        f"{tmp_path} is not empty and not a previous demo's folder: pass a new or empty folder (the demo "
        "writes a corpus and three runs there)\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_previous_demos_outputs_are_replaced_and_nothing_else(tmp_path):
    folder = DemoFolder(tmp_path / "demo")
    folder.clear()
    (folder.entry("data") / "sub").mkdir(parents=True)
    folder.entry("stage1-rope.log").write_text("log")
    (tmp_path / "demo/notes.txt").write_text("mine")  # the user's, added later
    again = DemoFolder(tmp_path / "demo")
    assert again.entries == ["data", "stage1-rope.log"]
    again.clear()
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [".olmo-repo-demo", "notes.txt"]
    assert json.loads((tmp_path / "demo/.olmo-repo-demo").read_text()) == []
    (tmp_path / "old/stage1-rope").mkdir(parents=True)  # a demo's folder from before the marker
    (tmp_path / "old/stage1-rope.log").write_text("log")
    DemoFolder(tmp_path / "old").clear()
    assert [p.name for p in (tmp_path / "old").iterdir()] == [".olmo-repo-demo"]
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="is a file"):
        DemoFolder(tmp_path / "file")


def test_positions_column_shows_every_repo_layer():
    record = {"step": 20, "train/CrossEntropyLoss": 3.0}
    assert positions_summary(record) == "-"
    for layer, (lo, hi) in {3: (-2.0, 5.25), 1: (-0.04, 0.31), 2: (-1.0, 1.0)}.items():
        record.update(
            {f"train/positions/layer{layer}/{k}": v for k, v in (("min", lo), ("max", hi), ("std", 1))}
        )
    assert positions_summary(record) == "1:[-0.04,0.31] 2:[-1,1] 3:[-2,5.2]"
