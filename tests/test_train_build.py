"""`olmo_repo.ai2olmo.train.build_trainer`'s optional branches, in this process: `compile` (every block compiled, and
training through it gives eager's losses), `save_data_indices` (each step's instance indices, appended on
resume), and the deprecated `optimizer.no_decay_norm_and_bias` (translated; norms and embeddings then get no
weight decay)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from .training import STAGE1, losses, make_trainer, small, write_corpus

U32 = 2.0**-24  # unit roundoff of fp32


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("build") / "data")


def _fit(overrides: list[str], device) -> None:
    with make_trainer(STAGE1, overrides, device) as trainer:
        trainer.fit()


@pytest.mark.slow
def test_compile_compiles_every_block_and_trains_to_eagers_losses(data, tmp_path, device):
    """Inductor on CPU (a C++ compiler): two steps, each loss within fp32 rounding of the eager run's."""
    steps = dict(max_duration=2, stop_at=2, no_pre_train_checkpoint="true")
    _fit(small(data, tmp_path / "eager", **steps), device)
    torch.manual_seed(0)
    compiled = small(
        data, tmp_path / "compiled", **steps, **{"compile.backend": "inductor", "compile.dynamic": "false"}
    )
    with make_trainer(STAGE1, compiled, device) as trainer:
        blocks = list(trainer.model.transformer.blocks)
        assert len(blocks) == 3 and all(b._compiled_call_impl is not None for b in blocks)
        trainer.fit()
    eager, fused = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert sorted(fused) == [1, 2]
    # Step 1 is the same weights on the same batch; step 2 follows one AdamW step (lr 3e-3 x sign-like
    # updates) from weights that differ by rounding only. A loss of ~log(128) ~ 4.9 summed over 128 tokens'
    # logits of d=32 layers: a few hundred roundings of it bound both.
    for step in (1, 2):
        assert abs(fused[step] - eager[step]) <= 512 * U32 * eager[step], (step, fused[step], eager[step])


def _indices(save_folder: Path) -> list[list[int]]:
    lines = gzip.decompress((save_folder / "data-indices/rank0.tsv.gz").read_bytes()).decode().splitlines()
    return [[int(x) for x in line.split("\t")] for line in lines]


@pytest.mark.slow
def test_data_indices_are_written_per_step_and_appended_on_resume(data, tmp_path, device):
    run, whole = tmp_path / "run", tmp_path / "whole"

    def fit(folder, steps: int) -> None:
        keys = dict(save_interval_unsharded=2, save_data_indices="true", no_pre_train_checkpoint="true")
        _fit(small(data, folder, max_duration=steps, stop_at=steps, **keys), device)

    fit(run, 2)
    first = _indices(run)
    assert [row[0] for row in first] == [1, 2] and all(
        len(row) == 1 + 4 for row in first
    )  # step, 4 instances
    # The same folder with a longer run resumes at step 2 and appends steps 3 and 4 (it does not refuse the
    # existing file, nor restart it).
    fit(run, 4)
    resumed = _indices(run)
    assert resumed[:2] == first and [row[0] for row in resumed] == [1, 2, 3, 4]
    instances = [i for row in resumed for i in row[1:]]
    assert len(set(instances)) == 16  # one epoch: no instance twice (a restarted data order would repeat)
    # And they are the instances an uninterrupted run trains on.
    fit(whole, 4)
    assert _indices(whole) == resumed


@pytest.mark.parametrize("no_decay", [True, False])
def test_deprecated_no_decay_norm_and_bias_sets_the_param_groups(data, tmp_path, device, no_decay):
    overrides = small(data, tmp_path / "run", no_pre_train_checkpoint="true")
    overrides += [f"optimizer.no_decay_norm_and_bias={str(no_decay).lower()}"]
    with make_trainer(STAGE1, overrides, device) as trainer:
        opt = trainer.cfg.optimizer
        assert opt.no_decay_norm_and_bias is None
        assert opt.decay_norm_and_bias is opt.decay_embeddings is (not no_decay)
        decay = {
            name.removeprefix("module."): group["weight_decay"]
            for group in trainer.optim.param_groups
            for name in group["param_names"]
        }
    assert set(decay) == {n for n, _ in trainer.model.named_parameters()}
    norms = [n for n in decay if "norm" in n or "ln_f" in n]
    assert len(norms) == 3 * 4 + 1  # per block attn/ff/q/k norms, and ln_f
    others = [n for n in decay if n not in norms and n != "transformer.wte.weight"]
    assert others and all(decay[n] == 0.1 for n in others)  # the linear layers keep the config's 0.1
    for name in [*norms, "transformer.wte.weight"]:
        assert decay[name] == (0.0 if no_decay else 0.1), name
