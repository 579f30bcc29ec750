"""Bad input to the OLMo-core commands: one line naming the key or file and what to do; nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from olmo_repo.cli import core_convert_from_hf, core_convert_to_hf, core_train
from olmo_repo.demo import BASE_DIR

from .training import TINY


@pytest.fixture
def olmo_checkpoint(tmp_path):
    """What an ai2-olmo (unsharded) checkpoint looks like from outside."""
    path = tmp_path / "olmo-ckpt"
    path.mkdir()
    (path / "config.yaml").write_text("model: {}\n")
    (path / "model.pt").write_bytes(b"")
    return path


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
    ],
)
def test_core_train_refuses_before_anything_is_written(tmp_path, capsys, olmo_checkpoint, args, says):
    data = tmp_path / "data"
    if "does not exist" not in says:
        data.mkdir()
        (data / "stage2.npy").write_bytes(b"\0" * 4 * 512 * 8)
    save = tmp_path / "run"
    argv = [str(TINY), f"--save-folder={save}", f"--data-root={data}"]
    # A second --save-folder in `args` wins over the first.
    assert core_train.main(argv + [a.format(olmo=olmo_checkpoint) for a in args]) == 1
    _one_line(capsys, "core_train.py", says)
    assert not save.exists()


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
    code = (
        "import runpy, sys\n"
        f"sys.argv = {argv!r}\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n"
        "    print(sorted(m for m in ('torch', 'olmo_core', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    line = result.stderr.rstrip("\n")
    assert result.returncode == 1 and "\n" not in line and line.startswith(f"{name}.py: error: "), (
        result.stderr
    )
    assert str(missing) in line and result.stdout.splitlines()[-1] == "[]", result.stdout
    assert not out.exists()


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
