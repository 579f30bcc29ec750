"""The demo's command line and output folder: a real --help, a user's folder is never emptied."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
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


def test_demo_constants_are_the_configs():
    from omegaconf import OmegaConf as om

    from olmo_repo import demo_corpus as demo

    stage1, *stage2 = (
        om.load(ROOT / f"configs/tiny-{name}.yaml") for name in ("stage1-rope", "stage2-repo", "stage2-rope")
    )
    for config in [stage1, *stage2]:
        assert config.model.max_sequence_length == demo.SEQ_LEN
        assert config.model.vocab_size == config.model.embedding_size == demo.VOCAB
        assert (config.model.eos_token_id, config.model.pad_token_id) == (0, 1)
        assert config.global_train_batch_size == demo.BATCH
    assert demo.SPLIT_WINDOWS["stage1"] == stage1.max_duration * demo.BATCH  # every window read once
    assert all(demo.SPLIT_WINDOWS["stage2"] == c.max_duration * demo.BATCH for c in stage2)


def test_corpus_windows_hold_whole_niah_documents(tmp_path, monkeypatch):
    from olmo_repo import demo_corpus as demo
    from olmo_repo.eval import niah

    monkeypatch.setattr(demo, "SPLIT_WINDOWS", {"stage1": 12, "stage2": 4, "val": 2})
    paths = demo.build_corpus(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "stage1.npy",
        "stage2.npy",
        "tokenizer.json",
        "val.npy",
    ]
    tokenizer = demo.build_tokenizer()
    assert len(tokenizer) == demo.VOCAB and tokenizer.eos_token_id == 0 and tokenizer.pad_token_id == 1
    assert tokenizer.tokenize(" 1848944") == ["Ġ", "184", "894", "4"]  # dolma2's groups of up to 3 digits
    windows = np.fromfile(paths["stage1"], dtype=np.uint32).reshape(-1, demo.SEQ_LEN)
    assert windows.shape == (12, demo.SEQ_LEN) and windows.max() < demo.VOCAB
    documents = [tokenizer.decode(doc) for w in windows for doc in np.split(w, np.flatnonzero(w == 0) + 1)]
    whole = [d for d in documents if d.endswith("<|endoftext|>")]  # the last of a window may be cut
    asked = [d for d in whole if "What is the special magic number for" in d]
    assert len(asked) >= 12  # NIAH documents and needle lists
    for document in asked:  # every question is followed by the value its needle holds
        given = re.search(r"provided text is (\d+)\.<\|endoftext\|>$", document)
        query = re.findall(r"What is the special magic number for (\S+) mentioned", document)[-1]
        needle = re.search(rf"special magic numbers for {re.escape(query)} is: (\d+)\.", document)
        assert given and needle and needle[1] == given[1], document[-120:]
    # The corpus's NIAH documents are RULER's prompts, with seeds the evaluation does not use.
    first = niah.niah_samples(tokenizer, demo.NIAH_VARIANTS[0], 512, n=1, seed=42)[0]
    assert not any(first.answers[0] in d for d in documents)
