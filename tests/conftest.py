from __future__ import annotations

import os
from pathlib import Path

# Tests never download: set before anything imports huggingface_hub (which reads it once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from olmo.model import OLMo
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import olmo_repo  # noqa: F401  (installs the block factory)
from olmo_repo import (
    RepoModelConfig,
    RepoTrainConfig,
    build_model,
    olmo2_model_config,
    repo_blocks,
)
from olmo_repo.modes import F_PHI_WEIGHTS

from .suite import built_once, register

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def tiny_config(**overrides) -> RepoModelConfig:
    """`olmo2_model_config` small enough for fp32 CPU tests."""
    kwargs = dict(
        d_model=64,
        n_heads=4,
        n_layers=4,
        mlp_ratio=4,
        max_sequence_length=64,
        vocab_size=100,
        embedding_size=128,
        eos_token_id=0,
        pad_token_id=1,
        init_device="cpu",
    )
    return olmo2_model_config(**{**kwargs, **overrides})


@pytest.fixture(scope="session")
def device() -> torch.device:
    """This process as a one-rank process group (gloo on CPU), with ai2-olmo's fixes for current torch."""
    from olmo_repo.ai2olmo.train import init_distributed
    from olmo_repo.upstream.torch import patch_torch_for_olmo

    patch_torch_for_olmo()
    return init_distributed()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# The byte-level tokenizer of `tokenizer_file` and the tiny checkpoints of `make_checkpoint`.
VOCAB, EMBEDDING, EOS, PAD = 258, 384, 256, 257


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory) -> Path:
    """A lossless byte-level tokenizer: 256 byte tokens, then <eos> (256) and <pad> (257)."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<eos>": EOS, "<pad>": PAD})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>", "<pad>"])
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return path


def spread_positions(model: torch.nn.Module, std: float = 0.5) -> None:
    """At OLMo's init f_phi predicts positions ~1e-4; widen them so that rotations matter in the tests."""
    for block in repo_blocks(model):
        for name in F_PHI_WEIGHTS:
            torch.nn.init.normal_(getattr(block, name).weight, std=std)


def make_checkpoint(path: Path, tokenizer: Path, **overrides) -> tuple[Path, OLMo]:
    """Save a tiny OLMo model (`tiny_config(**overrides)`, byte-level vocabulary) as an unsharded
    checkpoint dir (config.yaml, model.pt); return (dir, model in eval mode)."""
    config = RepoTrainConfig(
        model=tiny_config(
            vocab_size=VOCAB, embedding_size=EMBEDDING, eos_token_id=EOS, pad_token_id=PAD, **overrides
        )
    )
    config.tokenizer.identifier = str(tokenizer)
    model = build_model(config.model)
    spread_positions(model)
    path.mkdir(parents=True)
    config.save(path / "config.yaml")
    torch.save(model.state_dict(), path / "model.pt")
    return path, model.eval()


@pytest.fixture
def finished_demo(tmp_path_factory) -> Path:
    """A tiny demo run to its end without interruption, once per test run (under xdist too): read it, or copy
    it (`demo_runs.copy`) to change it."""
    from .demo_runs import finish

    return built_once(tmp_path_factory, "finished-demo", finish) / "demo"


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # tests/suite.py's hooks, once per session
