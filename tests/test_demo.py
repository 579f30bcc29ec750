"""The demo's command line and output folder: a real --help, a user's folder is never emptied."""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from olmo_repo.errors import CorruptFileError, RepoError
from olmo_repo.experiments.demo import BASE_DIR, config_path
from olmo_repo.experiments.demo.report import separation
from olmo_repo.experiments.demo.training import load_yaml, positions_summary
from olmo_repo.experiments.stages import Stages

from .conftest import ROOT

DEMO = ROOT / "scripts/demo.py"
CONFIGS = ("base-rope", "stage1-rope", "stage2-nope", "stage2-repo", "stage2-repo-learn", "stage2-rope")


def test_help_explains_the_folder_and_starts_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, str(DEMO), "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: demo.py [-h]")
    assert "previous demo's, which is resumed" in " ".join(result.stdout.split())
    assert not any(tmp_path.iterdir())  # no folder named --help
    # The commands parse before any heavy import: --help answers at once.
    light = "import sys, olmo_repo.cli.demo, olmo_repo.cli.demo_base; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", light]).returncode == 0


@pytest.mark.parametrize(
    ("lengths", "says"),
    [
        ("512,x", "expected comma-separated integers such as 4096,8192"),
        ("512,128", "every length must exceed the 128 generated tokens"),
    ],
)
def test_bad_lengths_are_one_line_before_anything_is_written(tmp_path, lengths, says):
    result = subprocess.run(
        [sys.executable, str(DEMO), str(tmp_path / "demo"), f"--lengths={lengths}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"demo.py: error: --lengths={lengths!r}: {says}"
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_users_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = subprocess.run([sys.executable, str(DEMO), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (
        f"demo.py: error: {tmp_path} is not empty and not a previous demo's folder: pass a new or empty folder (the demo "
        "writes its corpus and runs there)\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_previous_demos_outputs_are_replaced_and_nothing_else(tmp_path):
    folder = Stages(tmp_path / "demo")
    folder.clear()
    (folder.entry("data") / "sub").mkdir(parents=True)
    folder.entry("stage1-rope.log").write_text("log")
    (tmp_path / "demo/notes.txt").write_text("mine")  # the user's, added later
    again = Stages(tmp_path / "demo")
    assert again.entries == ["data", "stage1-rope.log"]
    again.clear()
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [".olmo-repo-demo", "notes.txt"]
    assert json.loads((tmp_path / "demo/.olmo-repo-demo").read_text()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(RepoError, match="is a file"):
        Stages(tmp_path / "file")


def test_a_stage_is_skipped_resumed_or_redone_from_its_record(tmp_path):
    folder = Stages(tmp_path / "demo")
    assert folder.state("train", "a", ["run"]) == "new"
    assert folder.record("train") == {"inputs": "a", "done": False}
    (folder.entry("run") / "ckpt").mkdir(parents=True)
    assert folder.state("train", "a", ["run"]) == "resume" and (tmp_path / "demo/run/ckpt").is_dir()
    folder.finish("train", wall_s=3.0)
    assert folder.state("train", "a", ["run"]) == "done" and folder.record("train")["wall_s"] == 3.0
    folder.redo("train", "a", ["run"])  # its records were lost: its outputs go, its inputs stay
    assert not (tmp_path / "demo/run").exists() and folder.record("train") == {"inputs": "a", "done": False}
    folder.finish("train")
    assert folder.state("train", "b", ["run"]) == "new"  # other inputs
    # Whole files, written only when they change (a rerun that changes nothing leaves them as they were).
    assert folder.write_text("report.md", "# r\n")
    report = tmp_path / "demo/report.md"
    before = report.stat().st_mtime_ns
    time.sleep(0.01)
    assert not folder.write_text("report.md", "# r\n") and report.stat().st_mtime_ns == before
    assert folder.write_text("report.md", "# s\n") and report.read_text() == "# s\n"
    assert "report.md" in Stages(tmp_path / "demo").entries
    names = sorted(p.name for p in (tmp_path / "demo").iterdir())
    assert names == [".olmo-repo-demo", "report.md", "stages.json"]


def test_positions_column_shows_every_repo_layer():
    record = {"step": 20, "train/CrossEntropyLoss": 3.0}
    assert positions_summary(record, [1, 2, 3]) == "-"
    for layer, (lo, hi) in {3: (-2.0, 5.25), 1: (-0.04, 0.31), 2: (-1.0, 1.0)}.items():
        record.update(
            {f"train/positions/layer{layer}/{k}": v for k, v in (("min", lo), ("max", hi), ("std", 1))}
        )
    assert positions_summary(record, [1, 2, 3]) == "1:[-0.04,0.31] 2:[-1,1] 3:[-2,5.2]"
    assert positions_summary(record, []) == "-"  # a run without RePo layers


def test_a_config_is_parsed_once_per_content_and_shared_read_only(tmp_path):
    """`load_yaml`, which the demo's report calls for the same configs over and over: a file that changes is read
    anew (whatever its size and time stamp), the same content is one parse, and no caller can change it."""
    path = tmp_path / "config.yaml"
    path.write_text("max_duration: 2\nmodel: {d_model: 8}\n")
    first = load_yaml(path)
    path.write_text("max_duration: 3\nmodel: {d_model: 8}\n")  # the same size, at once
    assert load_yaml(path).max_duration == 3
    path.write_text("max_duration: 2\nmodel: {d_model: 8}\n")
    assert load_yaml(path) is first and first.model.d_model == 8
    with pytest.raises(Exception, match="read-only"):
        first.model.d_model = 16


@pytest.mark.parametrize("name", CONFIGS)
def test_the_demos_configs_load(
    name,
):  # configs/ no longer holds them: tests/test_config.py does not see them
    from olmo_repo import RepoModelConfig, RepoTrainConfig

    assert isinstance(RepoTrainConfig.load(config_path(name), validate_paths=False).model, RepoModelConfig)


def test_demo_constants_are_the_configs():
    from omegaconf import OmegaConf as om

    from olmo_repo.experiments.demo import corpus as demo
    from olmo_repo.experiments.demo.base import BASE_STEPS

    base, stage1, *stage2 = (om.load(config_path(name)) for name in CONFIGS)
    for config in [base, stage1, *stage2]:
        assert config.model.max_sequence_length == demo.SEQ_LEN
        assert config.model.vocab_size == config.model.embedding_size == demo.VOCAB
        assert (config.model.eos_token_id, config.model.pad_token_id) == (0, 1)
        assert config.global_train_batch_size == demo.BATCH
    # Stage 1 continues the base model, stage 2 stage 1: the same model, the position modes aside; NoPE and
    # RePo on the same layers; the stage-2 runs read the same batches with the same evaluators; the learning arm
    # is the paper's arm with the index blend and f_phi's own learning rate.
    nope, repo, learn, rope = stage2
    assert all(c.model == base.model for c in [stage1, rope])
    assert all(
        {k: v for k, v in c.model.items() if not k.startswith("pe_")} == base.model
        for c in (nope, repo, learn)
    )
    assert (nope.model.pe_mode, repo.model.pe_mode, learn.model.pe_mode) == ("nope", "repo", "repo")
    assert nope.model.pe_start_layer == repo.model.pe_start_layer == learn.model.pe_start_layer
    assert {k: v for k, v in learn.model.items() if not k.startswith("pe_blend")} == repo.model
    assert 0 < learn.model.pe_blend_steps < learn.max_duration and learn.model.pe_blend_init == 1.0
    assert learn.f_phi.lr_multiplier > 1 and "f_phi" not in repo
    drop = ("run_name", "save_folder", "model", "f_phi")  # save_folder: runs/${run_name}
    assert all({k: v for k, v in c.items() if k not in drop} == {k: v for k, v in rope.items() if k not in drop}
               for c in (nope, repo, learn))  # fmt: skip
    assert demo.SPLIT_WINDOWS["base"] == base.max_duration * demo.BATCH == BASE_STEPS * demo.BATCH
    assert demo.SPLIT_WINDOWS["stage1"] == stage1.max_duration * demo.BATCH  # every window read once
    assert all(demo.SPLIT_WINDOWS["stage2"] == c.max_duration * demo.BATCH for c in stage2)


def test_corpus_windows_hold_whole_niah_documents(tmp_path):
    from olmo_repo.eval import niah
    from olmo_repo.experiments.demo import corpus as demo

    tokenizer = demo.build_tokenizer()
    paths = demo.build_corpus(tmp_path, tokenizer, {"stage1": 12, "stage2": 4, "val": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "stage1.npy",
        "stage2.npy",
        "tokenizer.json",
        "val.npy",
    ]
    # A split's windows do not depend on the other splits, and fewer are a prefix of more.
    again = demo.build_corpus(tmp_path / "again", tokenizer, {"stage1": 5})
    assert np.array_equal(
        np.fromfile(again["stage1"], np.uint32), np.fromfile(paths["stage1"], np.uint32)[: 5 * demo.SEQ_LEN]
    )
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


@pytest.mark.slow
def test_the_shipped_base_model_is_the_tiny_config_with_the_demos_tokenizer():
    from omegaconf import OmegaConf as om
    from transformers import AutoModelForCausalLM

    from olmo_repo.ai2olmo.convert import olmo_config_from_hf
    from olmo_repo.eval import niah
    from olmo_repo.experiments.demo import corpus as demo
    from olmo_repo.experiments.demo.base import HF_FILES, base_tokenizer
    from olmo_repo.hf import read_hf_config

    assert {p.name for p in BASE_DIR.iterdir()} == HF_FILES
    shipped, built = base_tokenizer(), demo.build_tokenizer()  # the tokenizer the code builds, bit for bit
    assert shipped.get_vocab() == built.get_vocab()
    text = "One of the special magic numbers for tidy-bone is: 8364512.\nWhat is it?"
    assert shipped(text).input_ids == built(text).input_ids
    config = olmo_config_from_hf(read_hf_config(BASE_DIR))
    expected = om.load(config_path("base-rope")).model
    for key in ("d_model", "n_heads", "n_layers", "vocab_size", "weight_tying", "rope_theta", "norm_after"):
        assert getattr(config, key) == expected[key], key
    model = AutoModelForCausalLM.from_pretrained(BASE_DIR)  # stock transformers: a plain Olmo2 model
    assert type(model).__name__ == "Olmo2ForCausalLM" and model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # Why it is shipped: it retrieves (the evaluation's own prompts and scorer; greedy, fp32).
    model.float()
    for sample in niah.niah_samples(shipped, "niah_single_1", demo.SEQ_LEN, n=4, seed=42):
        ids = shipped(sample.prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=shipped.pad_token_id)
        assert niah.score(shipped.decode(out[0, ids.shape[1] :]), sample.answers) == 1.0


def _package_data() -> list[str]:
    """The globs of olmo_repo/experiments/demo/'s package data in pyproject.toml (what a wheel ships besides modules)."""
    line = re.search(
        r'^"olmo_repo\.experiments\.demo" = (\[.*\])$', (ROOT / "pyproject.toml").read_text(), re.M
    )
    return json.loads(line[1])  # a TOML array of plain strings is JSON


def _installed_copy(site: Path) -> Path:
    """`olmo_repo` as a wheel installs it under `site`: its modules, and of olmo_repo/experiments/demo/ only its package
    data (no configs/, scripts/ or repository beside it)."""
    shutil.copytree(ROOT / "olmo_repo", site / "olmo_repo", ignore=shutil.ignore_patterns("__pycache__"))
    demo = site / "olmo_repo/experiments/demo"
    for path in [p for p in demo.rglob("*") if p.is_file() and p.suffix != ".py"]:
        if not any(path.relative_to(demo).match(g) for g in _package_data()):
            path.unlink()
    return site / "olmo_repo"


def test_the_demos_files_are_package_data():
    package = Path(str(importlib.resources.files("olmo_repo.experiments.demo")))
    assert BASE_DIR == package / "base_model" and BASE_DIR.is_dir()
    assert all(config_path(name) == package / f"configs/tiny-{name}.yaml" for name in CONFIGS)
    data = [
        p.relative_to(package) for p in package.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
    ]
    assert {str(p.parent) for p in data} == {"configs", "base_model"}
    assert all(any(p.match(g) for g in _package_data()) for p in data)  # a wheel ships them all
    sources = "\n".join(p.read_text() for p in package.rglob("*.py"))
    assert "parents[" not in sources and "ROOT" not in sources  # no path out of the package


@pytest.mark.slow
def test_demo_base_builds_an_hf_model_and_refuses_a_users_output(tmp_path):
    from transformers import AutoModelForCausalLM

    from olmo_repo.experiments.demo.base import HF_FILES

    script = ROOT / "scripts/demo_base.py"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("mine")
    args = [sys.executable, str(script), "--work", str(tmp_path / "work"), "--steps", "2"]
    refused = subprocess.run([*args, "--output", str(tmp_path / "mine")], capture_output=True, text=True)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"demo_base.py: error: {tmp_path / 'mine'} holds files that no base build wrote: pass a new folder as "
        "the output\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # nothing written
    refused = subprocess.run(
        [*args[:2], "--work", str(tmp_path / "mine"), "--output", str(tmp_path / "base")]
    )
    assert refused.returncode == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]

    # The build from a non-editable install: only the package, run from elsewhere (the training runs as
    # `-m olmo_repo.cli.train` with the packaged config).
    package = _installed_copy(tmp_path / "site")
    assert (
        not (package / "experiments/demo/configs/__init__.py").exists()
        and (package / "experiments/demo/base_model").is_dir()
    )
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    build = [
        "-m",
        "olmo_repo.cli.demo_base",
        "--work",
        "work",
        "--steps",
        "2",
        "--output",
        str(tmp_path / "base"),
    ]
    built = subprocess.run([sys.executable, *build], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert (
        f"-m olmo_repo.cli.train {package / 'experiments/demo/configs/tiny-base-rope.yaml'} " in built.stdout
    )
    # Progress and summary from the run's metrics.jsonl.
    assert re.search(
        r"^   base-rope step +1/2  loss \d+\.\d{3}\n   base-rope step +2/2  loss ", built.stdout, re.M
    )
    assert "Base model: 2 steps" in built.stdout
    assert {p.name for p in (tmp_path / "base").iterdir()} == HF_FILES
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert model.dtype == torch.bfloat16 and model.config.tie_word_embeddings
    assert np.fromfile(tmp_path / "work/data/base.npy", np.uint32).size == 2 * 8 * 512


def test_a_corrupt_shipped_base_stops_the_demo_in_one_line(tmp_path):
    from olmo_repo.experiments.demo.demo import run_demo

    base = tmp_path / "base"
    shutil.copytree(BASE_DIR, base)
    (base / "model.safetensors").write_bytes((BASE_DIR / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(CorruptFileError) as stopped:
        run_demo(tmp_path / "demo", base_dir=base)
    message = str(stopped.value)
    assert f"{base / 'model.safetensors'} cannot be read" in message and "make demo-base" in message
    assert "\n" not in message
    assert not (tmp_path / "demo").exists()  # nothing written


def test_separation_says_whether_and_when_repo_leads_nope_to_the_end():
    nope = {0: 0.0, 50: 0.2, 100: 0.3, 150: 0.3, 200: 0.4}
    late = separation({0: 0.0, 50: 0.15, 100: 0.45, 150: 0.5, 200: 0.6}, nope)
    assert "separates from NoPE at step 100" in late and "+20 at step 200" in late
    back = separation({0: 0.0, 50: 0.5, 100: 0.35, 150: 0.35, 200: 0.45}, nope)  # a lead that does not last
    assert "does not separate" in back and "largest lead is +30 points at step 50" in back
