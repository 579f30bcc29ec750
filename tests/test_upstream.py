"""Canaries of `olmo_repo.upstream`: each fails loudly when an upgrade changes an upstream function this
project patches, restates or calls by a private name. A failure names the thing: re-read the module of
`olmo_repo/upstream/` that lists it, adapt the code, then update its hash."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys
from importlib.metadata import version

import numpy as np
import pytest
import torch

from olmo_repo.upstream import resolve, source_hash
from olmo_repo.upstream.torch import patch_torch_for_olmo, read_train_state

MODULES = ["olmo", "torch", "wandb", "transformers", "lm_eval", "nltk", "python"]
PINNED = {  # distribution -> the version the canaries were taken at (= requirements/constraints-main.txt)
    "ai2-olmo": "0.6.0",
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "wandb": "0.31.0",
    "lm-eval": "0.4.13",
    "nltk": "3.10.4",
    "numpy": "1.26.4",
}
CANARIES = [
    (module, name, digest)
    for module in MODULES
    for name, digest in getattr(
        importlib.import_module(f"olmo_repo.upstream.{module}"), "CANARIES", {}
    ).items()
]


@pytest.mark.parametrize("distribution, pinned", PINNED.items())
def test_installed_versions_are_the_pinned_ones(distribution, pinned):
    assert version(distribution).split("+")[0] == pinned, (
        f"{distribution} is not the version the seam was read at"
    )


def check_canary(module: str, name: str, digest: str | None) -> None:
    """One canary: the upstream object `name` still has the source `digest` was taken from."""
    if digest is None:  # a C function or constant: it must exist
        resolve(name)
        return
    assert source_hash(name) == digest, (
        f"{name} changed upstream: re-read olmo_repo/upstream/{module}.py, adapt it, then update its hash"
    )


@pytest.mark.parametrize("module, name, digest", CANARIES, ids=[c[1] for c in CANARIES])
def test_upstream_source_is_what_the_seam_was_written_against(module, name, digest):
    check_canary(module, name, digest)


def test_a_canary_fails_on_an_upgrade_that_changes_one_token_and_only_then(tmp_path, monkeypatch):
    """An installed upstream package whose function changes by one token in a new release (the kind of change
    a restated function must follow): the canary taken at the old release fails, naming the seam module to
    re-read; a release that leaves the function alone passes; a release without the name fails to resolve."""
    releases = iter(range(10))

    def release(source: str) -> None:  # each in a folder of its own: no cached bytecode or source lines
        folder = tmp_path / f"release{next(releases)}" / "upstreamlib"
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(source)
        monkeypatch.syspath_prepend(str(folder.parent))
        sys.modules.pop("upstreamlib", None)

    def attention(body: str) -> str:
        return f"def attention(q, k):\n    return {body}\n\n\nOTHER = 1\n"

    release(attention("q @ k.T"))
    digest = source_hash("upstreamlib.attention")
    release(attention("q @ k.T") + "\nNEW = 2\n")  # a release that keeps the function
    check_canary("olmo", "upstreamlib.attention", digest)
    release(attention("k @ q.T"))  # one token moved
    with pytest.raises(
        AssertionError, match=r"upstreamlib\.attention changed upstream: re-read olmo_repo/upstream/olmo\.py"
    ):
        check_canary("olmo", "upstreamlib.attention", digest)
    release("OTHER = 1\n")  # the function is gone
    with pytest.raises(AttributeError, match="attention"):
        check_canary("olmo", "upstreamlib.attention", digest)


def test_every_module_of_the_seam_has_canaries_or_is_data_only():
    assert {m for m, _, _ in CANARIES} == {"olmo", "torch", "wandb", "transformers", "lm_eval", "python"}
    # nltk takes names, not behaviour: importing it is its canary (a rename fails at import).
    importlib.import_module("olmo_repo.upstream.nltk")


@pytest.mark.slow
def test_importing_the_package_patches_nothing_and_the_hf_side_needs_no_olmo():
    """`import olmo_repo.hf` (all a user of a converted model needs) loads neither ai2-olmo nor the factory;
    the OLMo side installs the factory on first use; torch is patched only when an entry point asks."""
    code = (
        "import sys, torch\n"
        "import olmo_repo.hf\n"
        "assert 'olmo' not in sys.modules and 'olmo_repo.ai2olmo.registry' not in sys.modules, sorted(sys.modules)\n"
        "stock = torch.serialization.get_safe_globals()\n"
        "from olmo.model import OLMoBlock\n"
        "assert OLMoBlock.__dict__['build'].__func__.__module__ == 'olmo.model'\n"
        "from olmo_repo import RepoModelConfig\n"
        "assert OLMoBlock.__dict__['build'].__func__.__module__ == 'olmo_repo.ai2olmo.registry'\n"
        "assert torch.serialization.get_safe_globals() == stock\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_reading_a_train_state_keeps_the_process_wide_patch(tmp_path):
    """`read_train_state` in a process that `patch_torch_for_olmo` patched leaves the types torch allows as they
    were: its context used to remove them on exit, and OLMo's next restore of a train.pt was refused."""
    patch_torch_for_olmo()
    torch.save({"path": pathlib.Path("run"), "rng": np.random.get_state()}, tmp_path / "train.pt")
    allowed = set(torch.serialization.get_safe_globals())
    assert read_train_state(tmp_path / "train.pt")["path"] == pathlib.Path("run")
    assert set(torch.serialization.get_safe_globals()) == allowed
    restored = torch.load(tmp_path / "train.pt", weights_only=True)  # as OLMo's restore reads it
    assert restored["path"] == pathlib.Path("run")


def test_evaluations_skip_lm_evals_environment_report_inside_the_block_only():
    """`without_environment_report` makes the `add_env_info` that `simple_evaluate` calls (pinned by its canary) a
    no-op inside the block, and gives lm-eval's back after it, also when the block fails."""
    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import add_env_info

    from olmo_repo.upstream.lm_eval import without_environment_report

    storage: dict = {}
    with pytest.raises(RuntimeError, match="inside"), without_environment_report():
        evaluator.add_env_info(storage)
        raise RuntimeError("inside")
    assert storage == {} and evaluator.add_env_info is add_env_info


@pytest.mark.slow
def test_rulers_word_keys_are_the_list_ruler_computes_at_import():
    """RULER's module, imported without its import-time `WORDS`, draws its word keys from the same list:
    `sorted(set(...))` of every adjective-noun pair, as the module computes it (~10 s here), in order and by
    index (where hyphenated adjectives make words of two adjectives interleave or coincide too)."""
    from olmo_repo.upstream.lm_eval import AdjectiveNounKeys, prepare_niah

    assert (
        isinstance(prepare_niah.WORDS, AdjectiveNounKeys)
        and prepare_niah.nouns == prepare_niah.r._categories["nouns"]
    )
    words = sorted({f"{adj}-{noun}" for adj in prepare_niah.adjs for noun in prepare_niah.nouns})
    keys = prepare_niah.WORDS
    assert len(keys) == len(words) and list(keys) == words
    merged = [i for i, word in enumerate(words) if word.count("-") > 1]  # in blocks of heads with hyphens
    for i in [0, 1, len(words) - 1, *merged[:: max(1, len(merged) // 500)], *range(7, len(words), 9973)]:
        assert keys[i] == words[i], i
    assert keys[-1] == words[-1]
    with pytest.raises(IndexError):
        keys[len(words)]
