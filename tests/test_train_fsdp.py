"""FSDP on CPU (gloo, 2 processes) through scripts/train.py: the recipe's stage-1 -> RePo stage-2 path with
sharded `olmo_core` checkpoints, a kill and a resume, unshard -> HF, and FSDP against DDP (the preflight
refusals are in test_preflight.py). Runs are shared between tests through module fixtures (each torchrun
start costs seconds)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2)
from olmo_repo import RepoTrainConfig, repo_layer_ids
from olmo_repo.ai2olmo.hf import convert_to_hf
from olmo_repo.ai2olmo.preflight import preflight
from olmo_repo.ai2olmo.stage1 import repo_param_names
from olmo_repo.ai2olmo.train import build_trainer, init_distributed
from olmo_repo.cli.unshard import main as unshard_main
from olmo_repo.upstream.torch import patch_torch_for_olmo

from .training import (
    ROOT,
    STAGE1,
    STAGE2_REPO,
    TRAIN_SCRIPT,
    VOCAB,
    cli,
    losses,
    small,
    subprocess_env,
    torchrun_command,
    write_corpus,
)

pytestmark = pytest.mark.slow  # two-process torchrun runs

U32 = 2.0**-24  # unit roundoff of fp32
U_BF16 = 2.0**-8  # unit roundoff of bf16


def _train_command(config: Path, overrides: list[str]) -> list[str]:
    return torchrun_command(TRAIN_SCRIPT, [str(config), *cli(overrides)])


def _run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    patch_torch_for_olmo()  # train.pt holds paths and numpy RNG state
    return write_corpus(tmp_path_factory.mktemp("fsdp") / "data")


@pytest.fixture(scope="module")
def stage1(data) -> Path:
    """Stage 1 from scratch with FSDP FULL_SHARD, one FSDP unit per block: the pre-train save, 4 steps, the
    sharded save at 4 and the final unsharded one."""
    save = data.parent / "stage1"
    steps = dict(max_duration=4, stop_at=4, save_interval=4, save_interval_unsharded=4)
    fsdp = {"distributed_strategy": "fsdp", "fsdp.wrapping_strategy": "by_block"}
    _run(_train_command(STAGE1, small(data, save, **fsdp, **steps)))
    return save


def _stage2(data: Path, save: Path, stage1: Path, **extra: object) -> list[str]:
    """The recipe at tiny scale: stage-1's unsharded checkpoint into a RePo run, 8 steps. Default: FSDP with the
    official 1B's settings (SHARD_GRAD_OP, one unit), sharded save at 4 and 8, the final one also unsharded."""
    settings: dict[str, object] = {
        "distributed_strategy": "fsdp",
        "fsdp.sharding_strategy": "SHARD_GRAD_OP",
        "load_path": stage1 / "step4-unsharded",
        "max_duration": 8,
        "stop_at": 8,
        "save_interval": 4,
        "save_interval_unsharded": 8,
    }
    return small(data, save, **{**settings, **extra})


@pytest.fixture(scope="module")
def stage2(data, stage1) -> Path:
    """The uninterrupted stage-2 run; `force_save_unsharded` also saves the state right after initialisation
    (step0-unsharded)."""
    save = data.parent / "stage2"
    out = _run(_train_command(STAGE2_REPO, _stage2(data, save, stage1, force_save_unsharded="true")))
    assert "Initialising from stage-1 checkpoint" in out and "fresh state for 6 RePo parameters" in out
    return save


def test_fsdp_stage1_trains_and_saves_sharded_and_unsharded(stage1):
    assert sorted(losses(stage1)) == [1, 2, 3, 4]
    assert "distributed_strategy: fsdp" in (stage1 / "config.yaml").read_text()
    for step in (0, 4):  # olmo_core: safetensors shards and trainer state per rank
        files = {str(p.relative_to(stage1 / f"step{step}")) for p in (stage1 / f"step{step}").rglob("*")}
        assert {f"{part}/rank_{r}.safetensors" for part in ("model", "optim") for r in (0, 1)} <= files
        assert {"train/rank0.pt", "train/rank1.pt", "config.yaml"} <= files
    unsharded = stage1 / "step4-unsharded"
    assert _load(unsharded / "train.pt")["world_size"] == 2
    optim = _load(unsharded / "optim.pt")["state"]
    assert len(optim) == len(_load(unsharded / "model.pt"))
    # The full optimizer state gathered on CPU keeps its two moments apart (torch's CPU offload aliased them);
    # the pre-train save's state initialisation took no step (olmo_core's took one).
    for name, state in optim.items():
        assert state["step"].item() == 4, name
        assert (state["exp_avg"] < 0).any() and not torch.equal(state["exp_avg"], state["exp_avg_sq"]), name


@pytest.mark.long
def test_stage1_init_into_fsdp_repo_run_is_exact(data, stage1, stage2, tmp_path):
    """Every base tensor and its AdamW state come from stage 1 bit-exact; the RePo weights are DDP's
    initialisation and their state is AdamW's initial one. Read back from the unsharded save FSDP gathered
    right after the initialisation (which failed while the RePo weights had no state)."""
    base, base_optim = _load(stage1 / "step4-unsharded/model.pt"), _load(stage1 / "step4-unsharded/optim.pt")
    init, init_optim = _load(stage2 / "step0-unsharded/model.pt"), _load(stage2 / "step0-unsharded/optim.pt")
    repo = repo_param_names(RepoTrainConfig.load(stage2 / "config.yaml", validate_paths=False).model)
    assert set(init) - set(base) == repo and len(repo) == 6
    assert all(torch.equal(init[k], v) for k, v in base.items())
    assert all(init[k].abs().sum() > 0 for k in repo)
    for name, state in base_optim["state"].items():
        assert all(torch.equal(init_optim["state"][name][k], v) for k, v in state.items()), name
    for name in repo:
        state = init_optim["state"][name]
        assert state["step"].item() == 0, name
        assert not state["exp_avg"].any() and not state["exp_avg_sq"].any(), name

    # DDP (here in one process) draws the same RePo weights: FSDP initialises the whole model before the wrap
    # too (after it, each rank would draw its shard from the same stream).
    cfg = RepoTrainConfig.load(
        STAGE2_REPO, _stage2(data, tmp_path / "ddp", stage1, distributed_strategy="ddp")
    )
    preflight(cfg, cuda=False, world_size=1)
    with build_trainer(cfg, init_distributed()) as trainer:
        assert all(torch.equal(trainer.model.state_dict()[k], init[k]) for k in repo)


def test_killed_fsdp_run_resumes_from_its_sharded_checkpoint_with_identical_losses(data, stage1, stage2):
    expected = losses(stage2)
    assert sorted(expected) == list(range(1, 9))
    run = data.parent / "killed"
    cmd = _train_command(STAGE2_REPO, _stage2(data, run, stage1))
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (run / "step4").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    # torchrun and its ranks (each in a session of its own) die together, as on preemption.
    tree = psutil.Process(proc.pid)
    processes = [tree, *tree.children(recursive=True)]
    for process in processes:
        process.kill()
    psutil.wait_procs(processes)
    assert max(losses(run)) < 8, "the run finished before it could be killed"

    out = _run(cmd)  # the same command again
    assert f"Resuming from {run / 'step4'} " in out  # sharded: olmo_core's restore
    assert losses(run) == expected  # exact float equality, fp32 on CPU


def test_unshard_then_hf_logits_equal_the_fsdp_model(data, stage2, tmp_path, capsys):
    sharded, unsharded, out = stage2 / "step8", stage2 / "step8-unsharded", tmp_path / "step8-unsharded"
    assert unshard_main(["--input", str(sharded), "--output", str(out)]) == 0
    # What the run's own unsharded save gathered through FSDP, bit for bit.
    assert (out / "config.yaml").read_text() == (unsharded / "config.yaml").read_text()
    model, expected_model = _load(out / "model.pt"), _load(unsharded / "model.pt")
    assert model.keys() == expected_model.keys() and all(
        torch.equal(model[k], expected_model[k]) for k in model
    )
    optim, expected_optim = _load(out / "optim.pt"), _load(unsharded / "optim.pt")
    assert optim["param_groups"] == expected_optim["param_groups"]
    assert optim["state"].keys() == expected_optim["state"].keys()
    for name, state in optim["state"].items():
        assert all(torch.equal(v, expected_optim["state"][name][k]) for k, v in state.items()), name
    train = _load(out / "train.pt")
    assert (train["global_step"], train["world_size"]) == (8, 2)

    # Refusals: one line naming the file and what to do.
    assert unshard_main(["--input", str(sharded), "--output", str(out)]) == 1
    assert unshard_main(["--input", str(unsharded), "--output", str(tmp_path / "x")]) == 1
    errors = capsys.readouterr().err.strip().splitlines()[-2:]
    assert "exists; pass --force" in errors[0] and "is unsharded already" in errors[1]
    assert unshard_main(["--input", str(sharded), "--output", str(tmp_path / "m"), "--model-only"]) == 0
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.yaml", "model.pt"]

    hf_dir = convert_to_hf(out, tmp_path / "hf")
    ids = torch.randint(2, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    # The FSDP model as the official configs build it (meta init, FULL_SHARD), restored from the shards.
    fsdp = {"distributed_strategy": "fsdp", "model.init_device": "meta", "load_path": sharded}
    args = [str(STAGE2_REPO), str(tmp_path / "ids.pt"), str(tmp_path / "logits.pt")]
    _run(torchrun_command(ROOT / "tests/fsdp_logits.py", args + cli(small(data, tmp_path / "run", **fsdp))))
    fsdp_logits = torch.load(tmp_path / "logits.pt", weights_only=True)  # [B, T, vocab]
    with torch.no_grad():
        hf_logits = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()(ids).logits
    # The same fp32 math, partly in another order (HF splits att_proj and ff_proj): a reassociated sum of d
    # terms moves by up to about d * u of its magnitude, over 2 sums per block and the head: 7 * d * u.
    bound = 7 * 32 * U32 * fsdp_logits.abs().max()
    assert (hf_logits - fsdp_logits).abs().max() <= bound


@pytest.mark.long
def test_fsdp_matches_ddp_in_fp32_and_bf16_within_rounding(data, stage1, stage2):
    """The stage-2 recipe run of the fixture (FSDP, fp32) against the same run with DDP, and with FSDP in bf16
    mixed precision (HYBRID_SHARD on a CPU device mesh, 1 replica x 2 shards): same stage-1 checkpoint, same
    initialisation of the RePo weights, same data."""
    no_saves = dict(save_interval="null", save_interval_unsharded="null", save_num_checkpoints_to_keep=0)
    runs = {
        "ddp": dict(distributed_strategy="ddp"),
        "bf16": {
            "precision": "amp_bf16",
            "fsdp.precision": "mixed",
            "fsdp.sharding_strategy": "HYBRID_SHARD",
        },
    }
    for name, extra in runs.items():
        _run(_train_command(STAGE2_REPO, _stage2(data, data.parent / name, stage1, **no_saves, **extra)))
    ddp, fsdp, bf16 = losses(data.parent / "ddp"), losses(stage2), losses(data.parent / "bf16")
    assert sorted(ddp) == sorted(fsdp) == sorted(bf16) == list(range(1, 9))

    # fp32. FSDP does DDP's float operations on the same operands, except that it may reassociate sums: the
    # 2-rank gradient reduction (a + b either way; the halving is exact) and kernels on views into flat
    # parameters (alignment can change a kernel's summation order). Reassociating a sum of n fp32 terms moves
    # it by at most (n - 1) * u * sum|terms|; the longest on the loss path is the mean of the batch's 4 x 32
    # token losses (~L each): bound 127 * u * L (3.6e-5 at L = 4.7). Later steps add parameter differences
    # of order lr * n * u, far below it. (A real fault is far above it: HYBRID_SHARD with replicas of one
    # rank, which do not sync gradients, was off by 4e-4 at step 2.)
    fp32_bound = {s: 127 * U32 * loss for s, loss in ddp.items()}
    assert all(abs(fsdp[s] - ddp[s]) <= fp32_bound[s] for s in ddp), (fsdp, ddp)

    # bf16 parameters and activations, fp32 gradient reduction: each bf16 rounding is a relative error of at
    # most u = 2^-8. Along the residual stream of the 3-layer model 2 * 3 + 2 roundings are in series
    # (embedding, each block's attention and MLP outputs, the final norm), each moving the loss by at most
    # about u * L to first order: bound 8 * u * L (0.15 at L = 4.7). And bf16 must show: the differences
    # exceed the fp32 bound.
    diffs = {s: abs(bf16[s] - ddp[s]) for s in ddp}
    assert all(diffs[s] <= 8 * U_BF16 * ddp[s] for s in ddp), diffs
    assert any(diffs[s] > fp32_bound[s] for s in ddp), diffs

    # RePo's positions stay fp32 inside the bf16 model: their logged extremes are not all bf16 values.
    records = [json.loads(line) for line in (data.parent / "bf16/metrics.jsonl").read_text().splitlines()]
    model = RepoTrainConfig.load(data.parent / "bf16/config.yaml", validate_paths=False).model
    keys = [f"train/positions/layer{i}/{stat}" for i in repo_layer_ids(model) for stat in ("min", "max")]
    extremes = [r[key] for r in records for key in keys if key in r]
    assert extremes and any(torch.tensor(v).bfloat16().item() != v for v in extremes)
