"""`olmo_repo.ai2olmo.preflight`: the checks before any heavy work (`preflight`, which names every problem and
what to change; `check_load_path_files`; `is_unsharded`), on configs built from the tiny demo configs."""

from __future__ import annotations

import functools
import http.server
import re
import shlex
import threading

import pytest
import torch
from olmo.exceptions import OLMoCheckpointError, OLMoConfigurationError

from olmo_repo import RepoTrainConfig
from olmo_repo.ai2olmo.preflight import check_load_path_files, is_unsharded, preflight

from .training import ROOT, STAGE1, documented_commands, small, truncate, write_corpus


def _config(tmp_path, *extra: str) -> RepoTrainConfig:
    data = write_corpus(tmp_path / "data", n_tokens=2_000)
    return RepoTrainConfig.load(STAGE1, small(data, tmp_path / "run") + list(extra))


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["data.paths=[/nonexistent/part-0.npy]"],
            r"1 data file\(s\) do not exist: data\.paths: /nonexistent/part-0\.npy",
        ),
        (
            ["load_path=/nonexistent/step3-unsharded"],
            r"load_path=/nonexistent/step3-unsharded is not a directory",
        ),
        (["save_folder=s3://bucket/run"], r"save_folder=s3://bucket/run is a URL.*--remote_save_folder"),
        (
            ["model.max_sequence_length=0"],  # OLMo's data loader divided by it
            r"model\.max_sequence_length=0 is not a training length: pass a whole number of tokens, at least 1",
        ),
        (["fused_loss=true"], r"fused_loss=true needs flash-attn.*--fused_loss=false"),
        (["precision=amp_bf16"], r"precision=amp_bf16 on CPU needs FSDP's mixed precision.*--precision=fp32"),
        (
            ["global_train_batch_size=6", "device_train_microbatch_size=4"],
            r"per-rank batch 6 \(global_train_batch_size=6 over 1 rank\(s\)\) is not a multiple of "
            r"device_train_microbatch_size=4: pass --device_train_microbatch_size=N with N dividing 6",
        ),
    ],
    ids=[
        "missing-data",
        "missing-load-path",
        "url-save-folder",
        "zero-length",
        "fused-loss",
        "amp-on-cpu",
        "batch",
    ],
)
def test_preflight_rejects_with_what_to_change(tmp_path, extra, message):
    with pytest.raises(OLMoConfigurationError, match=message):
        preflight(_config(tmp_path, *extra), cuda=False, world_size=1)


def test_preflight_refuses_an_olmo_core_checkpoint_as_load_path(tmp_path):
    """A checkpoint of the other trainer: the commands that convert it, named before anything runs."""
    (tmp_path / "step5" / "model_and_optim").mkdir(parents=True)
    (tmp_path / "step5" / "config.json").write_text("{}")
    with pytest.raises(
        OLMoConfigurationError,
        match=r"load_path: .*step5 is an OLMo-core checkpoint.*core_convert_to_hf\.py, then scripts/convert_from_hf\.py",
    ):
        preflight(_config(tmp_path, f"load_path={tmp_path / 'step5'}"), cuda=False, world_size=1)


def test_preflight_unwritable_save_folder(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OLMoConfigurationError, match=r"save_folder=.*file/run is not writable"):
        preflight(_config(tmp_path, f"save_folder={tmp_path / 'file/run'}"), cuda=False, world_size=1)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["sharded_checkpointer=torch_new"],
            r"=torch_new fails at the first save.*: pass --sharded_checkpointer=olmo_core",
        ),
        (
            ["sharded_checkpointer=torch_legacy"],
            r"=torch_legacy saves files that cannot be resumed.*=olmo_core",
        ),
        (
            ["sharded_checkpointer=local"],
            r"=local raises NotImplementedError.*: pass --sharded_checkpointer=olmo_core",
        ),
        (["load_path_sharded_checkpointer=torch_new"], r"pass --load_path_sharded_checkpointer=olmo_core"),
        (
            ["fsdp.use_orig_params=false"],
            r"sharded_checkpointer=olmo_core needs --fsdp\.use_orig_params=true",
        ),
        (
            ["fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid_sharding_num_model_replicas=2"],
            r"HYBRID_SHARD with 2 replicas of one rank each does not synchronise gradients",
        ),
        (
            ["fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid_sharding_num_model_replicas=3"],
            r"hybrid_sharding_num_model_replicas=3 must be positive and divide the 2 ranks",
        ),
        (
            ["fsdp.precision=null", "precision=amp_bf16"],
            r"precision=amp_bf16 on CPU needs FSDP's mixed precision",
        ),
        (
            ["fsdp.use_orig_params=false", "model.pe_mode=repo", "f_phi.only=true"],
            r"; f_phi\.only=true needs --fsdp\.use_orig_params=true \(FSDP otherwise flattens f_phi's weights",
        ),
        (
            ["fsdp.use_orig_params=false", "model.pe_mode=repo", "f_phi.lr_multiplier=3"],
            r"; f_phi\.lr_multiplier=3\.0 needs --fsdp\.use_orig_params=true",
        ),
    ],
    ids=[
        "torch_new",
        "torch_legacy",
        "local",
        "load-torch_new",
        "orig-params",
        "hybrid-1",
        "hybrid-3",
        "bf16",
        "f_phi-only",
        "f_phi-lr",
    ],
)
def test_fsdp_preflight_refuses_what_cannot_work_in_one_line(tmp_path, extra, message):
    with pytest.raises(OLMoConfigurationError, match=message) as error:
        preflight(_config(tmp_path, "distributed_strategy=fsdp", *extra), cuda=False, world_size=2)
    assert len(str(error.value).splitlines()) == 1  # what the command prints: one line


def test_fsdp_preflight_accepts_bf16_through_fsdp_on_cpu(tmp_path):
    cfg = _config(tmp_path, "distributed_strategy=fsdp", "precision=amp_bf16", "fsdp.precision=mixed")
    preflight(cfg, cuda=False, world_size=2)
    assert cfg.distributed_strategy == "fsdp"  # nothing switches silently


def test_documented_two_process_examples_pass_preflight(tmp_path):
    start = ".venv/bin/python scripts/train.py --nproc-per-node=2"
    commands = [c for c in documented_commands() if c.startswith(start)]
    assert len(commands) >= 2  # DDP and FSDP
    data = write_corpus(tmp_path / "data")  # the documented commands use the demo's corpus
    for command in commands:
        config, *flags = shlex.split(command)[3:]  # after python, scripts/train.py, --nproc-per-node=2
        overrides = [re.sub(r"^--data_prefix=.*", f"--data_prefix={data}", f) for f in flags]
        overrides = [o.removeprefix("--") for o in overrides + [f"--save_folder={tmp_path / 'run'}"]]
        preflight(RepoTrainConfig.load(ROOT / config, overrides), cuda=False, world_size=2)
    without = [o for o in overrides if not o.startswith("device_train_microbatch_size")]
    with pytest.raises(
        OLMoConfigurationError, match="pass --device_train_microbatch_size=N with N dividing 4"
    ):
        preflight(RepoTrainConfig.load(ROOT / config, without), cuda=False, world_size=2)


def test_a_sharded_load_path_needs_no_model_pt_but_intact_shards(tmp_path):
    cfg = RepoTrainConfig(load_path=str(tmp_path / "step4"))
    (tmp_path / "step4/train").mkdir(parents=True)
    torch.save({"x": torch.zeros(100)}, tmp_path / "step4/train/rank0.pt")
    check_load_path_files(cfg)
    truncate(tmp_path / "step4/train/rank0.pt")
    with pytest.raises(OLMoCheckpointError, match=r"step4/train/rank0\.pt: truncated"):
        check_load_path_files(cfg)


def test_is_unsharded_by_name_or_by_model_file_locally_and_over_http(tmp_path):
    (tmp_path / "step4/train").mkdir(parents=True)
    (tmp_path / "step4/train/rank0.pt").write_bytes(b"")
    (tmp_path / "step2").mkdir()
    (tmp_path / "step2/model.pt").write_bytes(b"")
    (tmp_path / "step3").mkdir()
    (tmp_path / "step3/model.safetensors").write_bytes(b"")
    assert is_unsharded(tmp_path / "step9-unsharded/")  # the name alone decides, even before it exists
    assert is_unsharded(tmp_path / "step2") and is_unsharded(tmp_path / "step3")
    assert not is_unsharded(tmp_path / "step4")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert is_unsharded(f"{url}/step2") and is_unsharded(f"{url}/step3")
        assert not is_unsharded(f"{url}/step4")
    finally:
        server.shutdown()
