"""Every script in scripts/ is a thin caller of `olmo_repo.cli.<name>.main`: `--help` explains every flag
the parser has, a bad flag is one line of usage (exit 2), and the light commands answer without importing
torch or ai2-olmo."""

from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("name", [n for n in SCRIPTS if n != "train"])
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
    assert exit.value.code == 2 and lines[0].startswith("usage:") and ": error: " in lines[-1], err
    assert sum(": error: " in line for line in lines) == 1 and "Traceback" not in err


def test_train_help_is_its_usage():
    train = importlib.import_module("olmo_repo.cli.train")
    assert train.main(["--help"]) == 0 and train.main([]) == 2


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
