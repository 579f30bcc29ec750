"""Bad input to the OLMo-core commands: one line naming the key or file and what to do; nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from olmo_repo.cli import core_convert_from_hf, core_convert_to_hf, core_train
from olmo_repo.experiments.demo import BASE_DIR

from .training import TINY, random_corpus


@pytest.fixture
def olmo_checkpoint(tmp_path):
    """What an ai2-olmo (unsharded) checkpoint looks like from outside."""
    path = tmp_path / "olmo-ckpt"
    path.mkdir()
    (path / "config.yaml").write_text("model: {}\n")
    (path / "model.pt").write_bytes(b"")
    return path


@pytest.fixture(scope="module")
def model_checkpoint(tmp_path_factory) -> Path:
    """A model-only OLMo-core checkpoint of the tiny config's RoPE model (a stage-1 start)."""
    from olmo_repo.olmocore.attention import with_position_modes
    from olmo_repo.olmocore.checkpoint import save_model

    from .training import tiny_experiment

    path = tmp_path_factory.mktemp("ckpt") / "stage1"
    model = with_position_modes(tiny_experiment(path, path).model, "rope")
    config = {
        "model": model.as_config_dict(),
        "dataset": {"tokenizer": {"identifier": str(BASE_DIR / "tokenizer.json")}},
        "train_module": {"max_sequence_length": 512},
    }
    save_model(model.build(init_device="cpu"), config, path)
    return path


def _copy_cut(checkpoint: Path, out: Path, name: str, keep: int = 100) -> Path:
    """A copy of `checkpoint` whose model_and_optim/`name` holds only its first `keep` bytes."""
    import shutil

    shutil.copytree(checkpoint, out)
    file = out / "model_and_optim" / name
    file.write_bytes(file.read_bytes()[:keep])
    return out


def _one_line(capsys, prog: str, says: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"{prog}: error: ") and says in err, err


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--model.block.sequence_mixer.pe_start_layer=9"],
            "model.block.sequence_mixer.pe_start_layer=9 is out of range",
        ),
        (["--model.block.sequence_mixer.n_kv_heads=3"], "model.block.sequence_mixer.n_kv_heads=3"),
        ([], "does not exist (pass --data-root"),
        (["--load_path={olmo}"], "ai2-olmo checkpoint"),
        (["--save-folder=s3://bucket/run"], "use e.g. s3://bucket/runs/run"),
        # An unknown override key: its nearest name, as the ai2-olmo side's configs say it (test_bad_input.py).
        (["--trainr.max_duration=3"], "error: trainr is not a config key; did you mean trainer?"),
        (
            ["--model.block.sequence_mixer.pe_mdoe=repo"],
            "error: model.block.sequence_mixer.pe_mdoe is not a config key; did you mean "
            "model.block.sequence_mixer.pe_mode?",
        ),
        (
            ["--trainer.callbacks.chekpointer.save_interval=3"],
            "did you mean trainer.callbacks.checkpointer?",
        ),
        (
            ["--trainer.callbacks.mine.x=1"],
            "trainer.callbacks.mine is not a config key (not in 'trainer.callbacks')",
        ),
        # A stage-1 checkpoint cut short: named before a process group starts (it was a traceback mid-load).
        (["--load_path={truncated}"], "__0_1.distcp is 100 bytes of"),
        (["--load_path={no_metadata}"], ".metadata cannot be read"),
        # What every rank would refuse once its model is built, said once by the launcher (no worker starts).
        (["--nproc-per-node=3"], "does not split into 3 data-parallel rank(s)"),
        (["--check", "--nnodes=2", "--nproc-per-node=3"], "into 6 data-parallel rank(s)"),
        (["--train_module.rank_microbatch_size=1000"], "is not a whole number of sequences"),
        # A training length of 0: OLMo-core divided by it (ZeroDivisionError); the same line as ai2-olmo's.
        (
            ["--train_module.max_sequence_length=0"],
            "error: train_module.max_sequence_length=0 is not a training length: pass a whole number of tokens, "
            "at least 1",
        ),
        (["--dataset.sequence_length=0"], "error: dataset.sequence_length=0 is not a training length"),
        # Issue 48's knobs: the rule set's messages (modes.py), the ai2-olmo side's too.
        (
            [
                "--model.block.sequence_mixer.pe_blend_init=1.5",
                "--model.block.sequence_mixer.pe_blend_steps=9",
            ],
            "model.block.sequence_mixer.pe_blend_init=1.5 is not a blend weight; allowed: a number in [0, 1]",
        ),
        (["--model.block.sequence_mixer.pe_blend_steps=-3"], "pe_blend_steps=-3 is not a step count"),
        (  # no anneal: the schedule would ignore p0 (ai2-olmo's words: tests/test_train_f_phi.py)
            ["--model.block.sequence_mixer.pe_blend_init=1"],
            "model.block.sequence_mixer.pe_blend_init=1.0 with model.block.sequence_mixer.pe_blend_steps=0 is no "
            "blend (p is 0 from step 0): set model.block.sequence_mixer.pe_blend_steps to the steps over which p "
            "falls to 0, or model.block.sequence_mixer.pe_blend_init=0",
        ),
        (["--f_phi.lr_multiplier=0"], "f_phi.lr_multiplier=0"),
        (["--f_phi.lr_multiplier=.inf"], "f_phi.lr_multiplier=inf; allowed: a finite number > 0"),
        (["--nproc-per-node=2", "--f_phi.weight_decay=-1"], "f_phi.weight_decay=-1"),
        (
            ["--f_phi.only=true", "--model.block.sequence_mixer.pe_mode=rope"],
            "f_phi.only=true trains f_phi alone, but this model has no RePo layer",
        ),
        # What the NIAH callback's build refuses once the model is up, said before any worker starts.
        (["--trainer.callbacks.niah.variants=[niah_bogus]"], "trainer.callbacks.niah.variants: unknown"),
        (
            ["--trainer.callbacks.niah.length=4096"],
            "niah.length=4096 is past train_module.max_sequence_length",
        ),
    ],
)
def test_core_train_refuses_before_anything_is_written(
    tmp_path, capsys, olmo_checkpoint, model_checkpoint, args, says
):
    data = tmp_path / "data"
    if "does not exist" not in says:
        data.mkdir()
        (data / "stage2.npy").write_bytes(b"\0" * 4 * 512 * 8)
    save = tmp_path / "run"
    argv = [str(TINY), f"--save-folder={save}", f"--data-root={data}"]
    # A second --save-folder in `args` wins over the first.
    truncated = _copy_cut(model_checkpoint, tmp_path / "truncated", "__0_1.distcp")
    no_metadata = _copy_cut(model_checkpoint, tmp_path / "no-metadata", ".metadata")
    args = [a.format(olmo=olmo_checkpoint, truncated=truncated, no_metadata=no_metadata) for a in args]
    assert core_train.main(argv + args) == 1
    _one_line(capsys, "core_train.py", says)
    assert not save.exists()


def _other_tokenizer(out: Path) -> Path:
    """The base model's tokenizer.json with the ids of two tokens swapped: another vocabulary of the same size."""
    import json

    data = json.loads((BASE_DIR / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    out.write_text(json.dumps(data))
    return out


def _data_and_stage1(
    tmp_path: Path, model_checkpoint: Path, eos_token_id: int | list[int]
) -> tuple[Path, Path]:
    """Tiny data made with the demo's tokenizer, and a copy of the stage-1 checkpoint recording that tokenizer
    (vocabulary 4096, padding 1) with `eos_token_id`."""
    import json
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    (data / "stage2.npy").write_bytes(b"\0" * 4 * 512 * 8)
    shutil.copyfile(BASE_DIR / "tokenizer.json", data / "tokenizer.json")
    load = tmp_path / "stage1"
    shutil.copytree(model_checkpoint, load)
    config = json.loads((load / "config.json").read_text())
    config["dataset"]["tokenizer"].update(vocab_size=4096, eos_token_id=eos_token_id, pad_token_id=1)
    (load / "config.json").write_text(json.dumps(config))
    return data, load


@pytest.mark.parametrize(
    "tokenizer, args, says",
    [
        (
            "base",
            ["--dataset.tokenizer.vocab_size=5000"],
            "vocab_size=5000 does not fit model.vocab_size=4096",
        ),
        ("base", ["--dataset.tokenizer.eos_token_id=2"], "dataset.tokenizer.eos_token_id=2, but load_path="),
        ("other", [], "is not the tokenizer of load_path="),
    ],
)
def test_core_train_refuses_data_made_with_another_tokenizer(
    tmp_path, capsys, model_checkpoint, tokenizer, args, says
):
    """Token ids of another vocabulary train without an error: the data's tokenizer is checked against the one
    the continued checkpoint records (`olmo_repo.vocab`) before anything starts, in one line."""
    data, load = _data_and_stage1(tmp_path, model_checkpoint, eos_token_id=0)
    save = tmp_path / "run"
    argv = [str(TINY), f"--save-folder={save}", f"--data-root={data}", f"--load_path={load}"]
    assert core_train.main(["--check", *argv]) == 0  # the model's own tokenizer passes
    capsys.readouterr()
    if tokenizer == "other":
        _other_tokenizer(data / "tokenizer.json")
    assert core_train.main(argv + args) == 1
    _one_line(capsys, "core_train.py", says)
    assert not save.exists()


def test_core_train_checks_the_tokenizer_each_data_folder_records(tmp_path, capsys, caplog, model_checkpoint):
    """The config may name the model's tokenizer while the data were made with another: the tokenizer.json that
    tokenize_text.py writes beside the token file is compared too. A checkpoint that records no tokenizer file
    (converted from an HF directory without one) cannot be compared token by token, and says so in one line."""
    import json
    import logging

    data, load = _data_and_stage1(tmp_path, model_checkpoint, eos_token_id=0)
    _other_tokenizer(data / "tokenizer.json")
    argv = [str(TINY), f"--save-folder={tmp_path / 'run'}", f"--data-root={data}", f"--load_path={load}",
            f"--dataset.tokenizer.identifier={BASE_DIR / 'tokenizer.json'}"]  # fmt: skip
    assert core_train.main(["--check", *argv]) == 1
    _one_line(
        capsys,
        "core_train.py",
        f"dataset.paths: {data / 'stage2.npy'} was made with {data / 'tokenizer.json'}, which is not the "
        f"tokenizer of load_path={load} ({BASE_DIR / 'tokenizer.json'}: ",
    )
    config = json.loads((load / "config.json").read_text())
    del config["dataset"]["tokenizer"]["identifier"]
    (load / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        assert core_train.main(["--check", *argv]) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "records no tokenizer file" in r.getMessage()]
    assert warning == (
        f"load_path={load} records no tokenizer file (none): the data are checked against its vocabulary size and "
        "end and padding ids only, not token by token (convert the model from an HF directory that holds its "
        "tokenizer.json)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "stage1"]


def test_core_train_takes_data_ended_by_any_of_the_models_end_ids(tmp_path, capsys, model_checkpoint):
    """A model with several end ids (Llama 3 Instruct: config.json lists them, the checkpoint records the list)
    trains on data ended by any one of them, and on no other."""
    data, load = _data_and_stage1(tmp_path, model_checkpoint, eos_token_id=[7, 0])
    argv = [str(TINY), f"--save-folder={tmp_path / 'run'}", f"--data-root={data}", f"--load_path={load}"]
    assert core_train.main(["--check", *argv]) == 0  # the tiny config's data ends documents with 0
    capsys.readouterr()
    assert core_train.main([*argv, "--dataset.tokenizer.eos_token_id=2"]) == 1
    _one_line(capsys, "core_train.py", "dataset.tokenizer.eos_token_id=2, but load_path=")


def test_core_train_check_starts_nothing(tmp_path, capsys):
    data = random_corpus(tmp_path / "data")  # with the tokenizer.json in-loop NIAH builds its prompts with
    argv = [str(TINY), f"--save-folder={tmp_path / 'run'}", f"--data-root={data}"]
    assert core_train.main(["--check", "--nnodes=2", "--nproc-per-node=2", *argv]) == 0
    assert capsys.readouterr().out.endswith("core_train.py: the run can start on 2 node(s) x 2 process(es)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_core_train_names_a_missing_config_file(tmp_path, capsys):
    assert core_train.main([str(tmp_path / "nope.py"), f"--save-folder={tmp_path / 'run'}"]) == 1
    _one_line(capsys, "core_train.py", "no such config file")


def test_converters_refuse_the_other_trainers_checkpoint(tmp_path, capsys, olmo_checkpoint):
    out = tmp_path / "out"
    assert core_convert_to_hf.main(["--input", str(olmo_checkpoint), "--output", str(out)]) == 1
    _one_line(capsys, "core_convert_to_hf.py", "ai2-olmo checkpoint")
    assert core_convert_to_hf.main(["--input", str(BASE_DIR), "--output", str(out)]) == 1
    _one_line(capsys, "core_convert_to_hf.py", "core_convert_from_hf.py converts it")
    assert core_convert_from_hf.main(["--input", str(olmo_checkpoint), "--output", str(out)]) == 1
    _one_line(capsys, "core_convert_from_hf.py", "olmo-ckpt")
    assert not out.exists()


def test_converters_name_a_missing_input(tmp_path, capsys):
    missing, out = tmp_path / "nowhere", tmp_path / "out"
    for command, prog in (
        (core_convert_to_hf, "core_convert_to_hf.py"),
        (core_convert_from_hf, "core_convert_from_hf.py"),
    ):
        assert command.main(["--input", str(missing), "--output", str(out)]) == 1
        _one_line(capsys, prog, str(missing))
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-512", "many"])
def test_a_length_that_is_not_a_positive_integer_is_a_usage_error(tmp_path, capsys, value):
    """`--sequence-length=0` used to train at the config's length, exit 0."""
    with pytest.raises(SystemExit) as exit:
        core_train.main([str(TINY), f"--save-folder={tmp_path / 'run'}", f"--sequence-length={value}"])
    assert exit.value.code == 2 and "--sequence-length" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        core_convert_to_hf.main(
            ["--input", str(tmp_path), "--output", str(tmp_path / "hf"), f"--max-position-embeddings={value}"]
        )
    assert exit.value.code == 2 and "--max-position-embeddings" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_core_train_refuses_a_folder_of_other_files(tmp_path, capsys):
    """A non-empty --save-folder that holds no run (the user's files) used to be trained in."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "stage2.npy").write_bytes(b"\0" * 4 * 512 * 8)
    save = tmp_path / "mine"
    save.mkdir()
    (save / "notes.txt").write_text("my notes")
    assert core_train.main([str(TINY), f"--save-folder={save}", f"--data-root={data}"]) == 1
    _one_line(capsys, "core_train.py", f"--save-folder={save} holds notes.txt but no run")
    assert [p.name for p in save.iterdir()] == ["notes.txt"] and (
        save / "notes.txt"
    ).read_text() == "my notes"


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, args",
    [
        ("core_convert_to_hf", ["--input", "{missing}", "--output", "{out}"]),
        ("core_convert_from_hf", ["--input", "{missing}", "--output", "{out}"]),
        ("core_train", ["{missing}", "--save-folder={out}"]),
    ],
)
def test_a_missing_input_is_refused_before_olmo_core_loads(tmp_path, name, args):
    """A typo in a path answers at once (it took 10-29 s: OLMo-core and torch loaded first)."""
    missing, out = tmp_path / "nowhere", tmp_path / "out"
    argv = [str(ROOT / "scripts" / f"{name}.py"), *(a.format(missing=missing, out=out) for a in args)]
    code = (  # the first exit handler runs last, also where the command ends the process itself
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print(sorted(m for m in ('torch', 'olmo_core', 'transformers') if m in sys.modules)))\n"
        f"sys.argv = {argv!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    line = result.stderr.rstrip("\n")
    assert result.returncode == 1 and "\n" not in line and line.startswith(f"{name}.py: error: "), (
        result.stderr
    )
    assert str(missing) in line and result.stdout.splitlines()[-1] == "[]", result.stdout
    assert not out.exists()


def test_an_error_after_olmo_core_loaded_is_still_the_commands_one_line(tmp_path):
    """OLMo-core logs "transformer_engine unavailable" when its attention is imported (no TE on CPU machines):
    not ahead of a command's one-line error (`olmo_repo.upstream.olmo_core.quiet_optional_backends`)."""
    command = [sys.executable, str(ROOT / "scripts" / "core_train.py"), str(ROOT / "configs" / "olmocore" /
               "tiny-stage2-repo.py"), f"--save-folder={tmp_path / 'out'}", f"--data-root={tmp_path / 'no-data'}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert result.stderr == (
        f"core_train.py: error: dataset.paths: {tmp_path / 'no-data' / 'stage2.npy'} does not exist "
        "(pass --data-root, or build the data first)\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_run_folder_where_a_checkpoint_is_needed_names_its_latest(tmp_path, capsys):
    """A run's folder instead of its stepN/: one line naming the checkpoint to pass."""
    from olmo_repo.olmocore.checkpoint import MODEL_AND_OPTIM

    run = tmp_path / "run"
    for step in (2, 10, 4):  # numerically latest, not by name
        (run / f"step{step}" / MODEL_AND_OPTIM).mkdir(parents=True)
        (run / f"step{step}" / MODEL_AND_OPTIM / ".metadata").write_bytes(b"")
    assert core_convert_to_hf.main(["--input", str(run), "--output", str(tmp_path / "hf")]) == 1
    _one_line(capsys, "core_convert_to_hf.py", f"{run}: not an OLMo-core checkpoint but a run's folder")
    data = tmp_path / "data"
    data.mkdir()
    (data / "stage2.npy").write_bytes(b"\0" * 4 * 512 * 8)
    save = tmp_path / "new"
    argv = [str(TINY), f"--save-folder={save}", f"--data-root={data}", f"--load_path={run}"]
    assert core_train.main(argv) == 1
    _one_line(capsys, "core_train.py", f"e.g. the latest, {run / 'step10'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "run"]


def _run_with_steps(run: Path, checkpoint: Path, steps: dict[int, str | None]) -> None:
    """A run folder whose stepN/ are copies of `checkpoint` with a train state, the file named cut short."""
    import torch

    for step, cut in steps.items():
        dest = run / f"step{step}"
        _copy_cut(checkpoint, dest, cut) if cut else __import__("shutil").copytree(checkpoint, dest)
        (dest / "train").mkdir()
        torch.save({"global_step": step}, dest / "train" / "rank0.pt")


def test_a_corrupt_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before(
    tmp_path, capsys, caplog, model_checkpoint
):
    """As on the ai2-olmo side (test_run_folder.py): the newest checkpoint cut short is moved aside (never
    deleted) with a warning, so that OLMo-core's resume, which takes the newest, loads the intact one; every
    checkpoint corrupt is one line, nothing moved."""
    data = random_corpus(tmp_path / "data")
    run = tmp_path / "run"
    _run_with_steps(run, model_checkpoint, {2: None, 4: "__0_1.distcp"})
    argv = [str(TINY), f"--save-folder={run}", f"--data-root={data}", "--dry-run"]
    assert core_train.main(argv) == 0
    assert sorted(p.name for p in run.iterdir()) == ["step2", "step4.corrupt"]
    assert (
        "step4 is corrupt" in caplog.text and "resuming from" in caplog.text and "__0_1.distcp" in caplog.text
    )
    capsys.readouterr()

    broken = tmp_path / "broken"
    _run_with_steps(broken, model_checkpoint, {2: ".metadata", 4: "__0_1.distcp"})
    argv[1] = f"--save-folder={broken}"
    assert core_train.main(argv) == 1
    _one_line(capsys, "core_train.py", f"no intact checkpoint in {broken} to resume from (step4: ")
    assert sorted(p.name for p in broken.iterdir()) == ["step2", "step4"]


def test_a_truncated_checkpoint_is_one_line_for_the_converter(tmp_path, capsys, model_checkpoint):
    truncated = _copy_cut(model_checkpoint, tmp_path / "truncated", "__0_1.distcp")
    assert core_convert_to_hf.main(["--input", str(truncated), "--output", str(tmp_path / "hf")]) == 1
    _one_line(capsys, "core_convert_to_hf.py", "__0_1.distcp is 100 bytes of")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "tokenizer, says",
    [
        (True, "trainer.callbacks.niah: niah_single_1 at 100 tokens: niah_single_1: length 100 is too short"),
        (False, "trainer.callbacks.niah.tokenizer.identifier={data}/tokenizer.json does not exist"),
    ],
)
def test_a_niah_length_its_haystack_does_not_fit_is_refused_before_workers_start(
    tmp_path, capsys, tokenizer, says
):
    """The launcher builds one prompt per variant: what each worker's NIAH build would refuse, said once."""
    data = random_corpus(tmp_path / "data")
    if not tokenizer:
        (data / "tokenizer.json").unlink()
    save = tmp_path / "run"
    argv = [str(TINY), f"--save-folder={save}", f"--data-root={data}", "--nproc-per-node=2",
            "--trainer.callbacks.niah.length=100"]  # fmt: skip
    assert core_train.main(argv) == 1
    _one_line(capsys, "core_train.py", says.format(data=data))
    assert not save.exists()


def test_evaluating_an_ai2_olmo_checkpoint_without_ai2_olmo_says_where_to_convert_it(tmp_path):
    """This environment has no ai2-olmo: scripts/eval.py on an ai2-olmo checkpoint is one line naming the converter,
    not an import traceback; nothing is written."""
    import torch

    ckpt = tmp_path / "olmo-ckpt"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text("model: {}\n")
    torch.save({"w": torch.zeros(1)}, ckpt / "model.pt")  # intact, so the files pass their check
    out = tmp_path / "eval"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval.py"), str(ckpt), "--tasks=niah_single_1", "--lengths=512",
         f"--out={out}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    err = done.stderr.strip()
    assert done.returncode == 1 and err.count("\n") == 0, err
    assert f"{ckpt} is an ai2-olmo checkpoint and this environment has no ai2-olmo (olmo is missing)" in err
    assert "scripts/convert_to_hf.py" in err and not out.exists()


def test_an_ai2_olmo_config_or_command_says_where_it_runs(tmp_path, capsys):
    """A YAML config given to core_train.py was a bare AssertionError; scripts/train.py here (no ai2-olmo) an
    import traceback."""
    from olmo_repo.cli import train as train_cli

    yaml = ROOT / "configs/official-1B-repo.yaml"
    assert core_train.main([str(yaml), f"--save-folder={tmp_path / 'run'}"]) == 1
    assert capsys.readouterr().err == (
        f"core_train.py: error: {yaml} is an ai2-olmo config (YAML, configs/*.yaml): train it with scripts/train.py\n"
    )
    assert train_cli.main([str(yaml)]) == 1
    assert capsys.readouterr().err == (
        "train.py: error: needs the ai2-olmo extra (olmo is not installed): run it with .venv/bin/python "
        "(make install)\n"
    )
    assert sorted(tmp_path.iterdir()) == []


def test_query_heads_that_do_not_group_over_the_key_value_heads_are_refused(tmp_path, capsys):
    """A stock Llama with 6 query heads over 4 key/value heads: converted, it failed at evaluation with a size
    mismatch (the ai2-olmo converter and evaluation: tests/test_bad_input.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = tmp_path / "model"
    config = LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=6, num_key_value_heads=4, head_dim=16, eos_token_id=1)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(model)
    capsys.readouterr()  # its progress bar
    assert core_convert_from_hf.main(["--input", str(model), "--output", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"core_convert_from_hf.py: error: {model}/config.json: num_key_value_heads=4 does not divide "
        "num_attention_heads=6: grouped-query attention needs the same number of query heads per key/value head; "
        "allowed: a divisor of 6\n"
    )
    assert not (tmp_path / "out").exists()
