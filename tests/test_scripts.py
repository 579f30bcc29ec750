"""Every script in scripts/ is a thin caller of `olmo_repo.cli.<name>.main` and follows one convention: `--help`
explains every flag the parser has, a bad flag is one line of usage and `PROG: error:` (exit 2), a missing input
is one line `PROG: error:` (exit 1), Ctrl-C exits 130, and the light commands answer without importing torch or
ai2-olmo. Each is also a console script of the package (`olmo-repo-<name>`, the same `main`), so a
pip-installed package needs no checkout."""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import tomllib

from olmo_repo.cli import command, run
from olmo_repo.errors import RepoError

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py"))
# Commands whose --help must not import torch, ai2-olmo or lm-eval (parsing comes before the heavy imports).
LIGHT = set(SCRIPTS)


def test_every_script_is_three_lines_calling_its_cli_module():
    for name in SCRIPTS:
        tree = ast.parse((ROOT / "scripts" / f"{name}.py").read_text())
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert [(i.module, [a.name for a in i.names]) for i in imports] == [
            (f"olmo_repo.cli.{name}", ["main"])
        ]
        assert len(tree.body) == 3, (
            name
        )  # docstring, import, `if __name__ == "__main__": raise SystemExit(main())`


def console_script(name: str) -> str:
    """The console script of scripts/NAME.py: `olmo-repo-` and its name with dashes."""
    return "olmo-repo-" + name.replace("_", "-")


def test_every_script_is_a_console_script_with_the_same_main():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert declared == {console_script(name): f"olmo_repo.cli.{name}:main" for name in SCRIPTS}
    # and the installed package's metadata says the same (an install older than pyproject.toml fails here)
    installed = {
        ep.name: ep.value for ep in entry_points(group="console_scripts") if ep.name.startswith("olmo-repo-")
    }
    assert installed == declared


def test_a_console_script_answers_help_and_errors_as_its_script(tmp_path):
    """Run from outside the checkout: the installed command, not scripts/."""
    command = Path(sys.executable).parent / console_script("fetch")
    help = subprocess.run([command, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert help.returncode == 0 and help.stdout.startswith("usage: fetch.py "), help.stdout + help.stderr
    args = [command, str(tmp_path / "nowhere.yaml"), "--to", "out"]
    missing = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert missing.returncode == 1 and missing.stderr.startswith("fetch.py: error: "), missing.stderr
    assert list(tmp_path.iterdir()) == []


def _parser(name: str) -> argparse.ArgumentParser:
    """The command's argparse parser, recorded while `main(['--help'])` runs (it prints the help)."""
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_known_args  # parse_args calls it too

    def record(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_known_args = record  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            importlib.import_module(f"olmo_repo.cli.{name}").main(["--help"])
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    return seen[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_explains_every_flag_and_a_bad_flag_is_one_usage_line(name, capsys):
    flags = [
        s for action in _parser(name)._actions for s in action.option_strings if s not in ("-h", "--help")
    ]
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage:") and all(flag in help_text for flag in flags), name
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(f"olmo_repo.cli.{name}").main(["--no-such-flag"])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert exit.value.code == 2 and lines[0].startswith(f"usage: {name}.py ") and len(lines) >= 2, err
    assert lines[-1].startswith(f"{name}.py: error: ") and sum(": error: " in line for line in lines) == 1, (
        err
    )


# What each command reads (a missing file) or, for the demo's two commands, which read only what the package
# ships, the output they refuse (a file where their folder goes).
BAD_INPUT = {
    "convert_from_hf": ["--input", "{missing}", "--output", "out"],
    "convert_to_hf": ["--input", "{missing}", "--output", "out"],
    "demo": ["{file}"],
    "demo_base": ["--output", "{file}"],
    "eval": ["{missing}", "--out", "out"],
    "explore": ["{missing}", "--export", "{file}", "page.html"],
    "fetch": ["{missing}", "--to", "out"],
    "flops": ["{missing}"],
    "plot_positions": ["{missing}", "--text", "x", "--out", "plot.png"],
    "prepare_data": ["--model", "{missing}", "--output", "out", "corpus.jsonl"],
    "tokenize_text": ["--model", "{missing}", "--output", "out"],
    "train": ["{missing}"],
    "unshard": ["--input", "{missing}", "--output", "out"],
}


HEAVY = ("torch", "olmo", "olmo_core", "transformers", "lm_eval")  # seconds to import, each


def run_script(script: Path, args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python SCRIPT ARGS` in `cwd`, and the modules of `HEAVY` it had imported when it exited (said by the first
    exit handler, which runs last, also where the command ends the process itself: `olmo_repo.cli.command`)."""
    code = (
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: print(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
        f"sys.argv = [{str(script)!r}, *{args!r}]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300
    )
    return result, eval(result.stdout.splitlines()[-1])


# The OLMo-core commands: tests/core/test_bad_input.py
@pytest.mark.parametrize("name", sorted(BAD_INPUT))
def test_a_missing_input_is_one_error_line_and_exit_1_before_any_heavy_import(name, tmp_path):
    missing, file = tmp_path / "nowhere", tmp_path / "mine.txt"
    file.write_text("mine")
    args = [a.format(missing=missing, file=file) for a in BAD_INPUT[name]]
    result, imported = run_script(ROOT / "scripts" / f"{name}.py", args, tmp_path)
    line = result.stderr.rstrip("\n")
    assert result.returncode == 1 and "\n" not in line and line.startswith(f"{name}.py: error: "), (
        result.stderr
    )
    assert str(missing if "{missing}" in BAD_INPUT[name] else file) in line, line
    assert imported == [], imported  # refused before torch, ai2-olmo, OLMo-core or lm-eval load
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"] and file.read_text() == "mine"


def test_run_is_the_convention(capsys):
    def bug() -> None:
        raise ZeroDivisionError("a bug keeps its traceback")

    def interrupted() -> None:
        raise KeyboardInterrupt

    assert run("x.py", lambda: None) == 0 and run("x.py", lambda: 3) == 3
    assert run("x.py", lambda: Path("/nowhere/file").read_bytes()) == 1
    assert capsys.readouterr().err == "x.py: error: [Errno 2] No such file or directory: '/nowhere/file'\n"
    assert run("x.py", lambda: {}["key"]) == 1 and capsys.readouterr().err == "x.py: error: key\n"
    assert run("x.py", interrupted) == 130 and capsys.readouterr().err == "x.py: interrupted\n"
    with pytest.raises(ZeroDivisionError):
        run("x.py", bug)
    assert run("x.py", bug, lambda: (RepoError, ZeroDivisionError)) == 1
    with pytest.raises(KeyError):  # narrowed: a KeyError is then a bug
        run("x.py", lambda: {}["key"], lambda: (RepoError,))


def test_freeze_imported_freezes_until_exit_and_the_process_ends_quietly():
    """`freeze_imported` (the training commands, once their trainer is imported): what is alive is frozen out of
    the collector's reach, and the process ends as it would without it (left frozen at exit, Triton's extension,
    which `torch._dynamo` imports, reports its objects as leaks on stderr)."""
    code = "import gc, torch._dynamo\nfrom olmo_repo.cli import freeze_imported\nfreeze_imported()\nprint(gc.get_freeze_count())\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    assert int(result.stdout) > 100_000  # torch's modules alone


def test_a_command_run_as_the_process_ends_it_with_its_status_after_the_exits_first_steps(tmp_path):
    """`command`'s `main()` without argv (a script, a console script, `python -m`): the process ends as soon as
    `main` returns, after what the interpreter's exit does before its module teardown (an executor's and a
    thread's last writes, the atexit handlers, Python's and C's buffered output), with its status; the teardown
    (here a module-level object's finalizer) is skipped. With argv, or under a profiler, `main` only returns."""
    code = f"""
import atexit, ctypes, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from olmo_repo.cli import command
out = Path({str(tmp_path)!r})

class Finalized:
    def __init__(self, path):
        self.path = path

    def __del__(self, open=open):  # builtins are gone by the time a teardown gets here
        with open(self.path, "w") as f:
            f.write("done")

kept = Finalized(str(out / "teardown"))

@command
def main(argv=None):
    ThreadPoolExecutor(1).submit(lambda: (time.sleep(0.3), (out / "executor").write_text("done")))
    threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
    atexit.register(lambda: (out / "atexit").write_text("done"))
    print("python", end="")
    ctypes.CDLL(None).printf(b" c")
    return 3

main()
print(" after main")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output to a pipe is buffered
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert (result.returncode, result.stdout, result.stderr) == (3, "python c", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit", "executor", "thread"]
    assert command(lambda argv: 5)(["in", "process"]) == 5
    # Under a profiler (cProfile writes its file after the script), the process goes on as without `command`.
    profiled = subprocess.run([sys.executable, "-c", "import sys; sys.setprofile(lambda *a: None)\n" + code],
                              capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert profiled.returncode == 0 and "after main" in profiled.stdout, profiled.stdout + profiled.stderr
    assert (tmp_path / "teardown").is_file()


def test_every_command_is_a_command():
    """Every script's `main` goes through `olmo_repo.cli.command`: its process keeps working when its terminal is
    lost (`olmo_repo.terminal`) and ends without the module teardown."""
    for name in SCRIPTS:
        main = importlib.import_module(f"olmo_repo.cli.{name}").main
        assert main.__code__ is command(lambda argv: 0).__code__, name  # the wrapper `command` returns


@pytest.mark.parametrize("name", sorted(LIGHT))
def test_light_commands_answer_help_without_torch_or_olmo(name):
    code = (
        "import sys\n"
        f"from olmo_repo.cli.{name} import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'olmo', 'transformers', 'lm_eval') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr


def test_convert_to_hf_offers_the_dtypes_the_package_has(capsys):
    from olmo_repo.hf import DTYPES

    dtype = next(a for a in _parser("convert_to_hf")._actions if a.dest == "dtype")
    assert sorted(dtype.choices) == sorted(DTYPES)


def test_a_config_validators_error_is_said_by_its_cause(capsys):
    """huggingface_hub wraps a config validator's ValueError in a header line that names no key ("Class
    validation error for validator 'validate_position_modes':"): the commands print the cause instead."""
    from olmo_repo.hf import RepoOlmo2Config

    with pytest.raises(Exception) as error:
        RepoOlmo2Config(num_hidden_layers=2, pe_mode="repo", pe_start_layer=5)
    assert (
        str(error.value).startswith("Class validation error")
        and run("x.py", lambda: raise_(error.value)) == 1
    )
    assert capsys.readouterr().err == (
        "x.py: error: pe_start_layer=5 is out of range: allowed 0..1 (num_hidden_layers=2)\n"
    )


def raise_(error: BaseException) -> None:
    raise error


def test_tokenize_text_writes_the_bytes_it_always_wrote(tmp_path):
    """The SmolLM2 recipe's numbers depend on tokenize_text.py's token file: the same text and tokenizer give the
    bytes it wrote before scripts/prepare_data.py existed (sha256 taken then, at dc60c04)."""
    import hashlib

    from olmo_repo.data.tokens import Documents, tokenize_text
    from olmo_repo.experiments.demo import BASE_DIR

    texts = [
        "The code of apple is 123.",
        "def f(x):\n    return x ** 2  # émoji 😀, 日本語\n",
        "<|endoftext|> inside text, and   spaces\t\ttabs.",
    ]
    written = tokenize_text(BASE_DIR, tmp_path / "out", Documents("t", texts), progress=False)
    digest = hashlib.sha256((tmp_path / "out" / "train.npy").read_bytes()).hexdigest()
    assert (written.tokens, digest) == (
        76,
        "69e5b2cd030547d57559bfbdfec477c5971435a8e64a801766aa7114ed0d8e44",
    )


def test_tokenize_text_names_a_text_that_is_a_folder_or_holds_no_text(tmp_path, capsys):
    """A folder was `[Errno 21] Is a directory`; an empty file, beside others, a document of the end id alone."""
    from olmo_repo.cli import tokenize_text
    from olmo_repo.experiments.demo import BASE_DIR

    (tmp_path / "a.txt").write_text("some text")
    (tmp_path / "empty.txt").write_text(" \n")
    for text, says in ((tmp_path, "is a folder: name its files"), (tmp_path / "empty.txt", "holds no text")):
        args = ["--model", str(BASE_DIR), "--output", str(tmp_path / "out"), "--no-progress"]
        assert tokenize_text.main([*args, "--text", str(tmp_path / "a.txt"), str(text)]) == 1
        assert capsys.readouterr().err == f"tokenize_text.py: error: --text {text} {says}" + (
            " (one document each)\n" if text == tmp_path else " (empty or only white space)\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "empty.txt"]
