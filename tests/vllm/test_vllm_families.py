"""vLLM (through this project's plugin) serves `repo_llama` and `repo_qwen3`: tiny random fp32 checkpoints written as
the converters write them (`save_hf`), RePo from layer 1 (layer 0 RoPE), against HF.

One engine per family (each start costs seconds), everything about it checked in it: greedy tokens of a batch of
prompts equal HF's (twice, the second pass hitting the prefix cache where it is on), prompt log-probs within the
fp32 bound of `engines.logprob_bound`, and, where the prompt is computed in full, each RePo layer's positions.
Llama: grouped-query attention, tied embeddings, attention bias, Llama 3's RoPE scaling; loaded without remote
code, prefix caching and chunked prefill on (a tiny tied model's greedy continuation repeats a token: the prompt
log-probs are its finer check). Qwen 3: head_dim (64) != hidden_size / heads (32), untied, YaRN,
grouped-query attention; loaded through its remote code, the prompt computed in full. Two tensor-parallel ranks for
Qwen 3 (each holds one key/value head, its per-head norms and its row of final_map).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from . import tiny
from .engines import SWITCHES, YARN, check_against_hf, check_positions, hf_outputs

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
# f_phi reads the normed hidden state (pre-norm families): final_map 4x OLMo's (`spread`) spreads the positions to
# hundreds
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(
        pe_mode="repo",
        pe_start_layer=1,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        attention_bias=True,
        rope_parameters=LLAMA3,
        spread=1.0,
    ),
    "qwen3": dict(
        pe_mode="repo",
        pe_start_layer=1,
        num_key_value_heads=2,
        head_dim=64,
        rope_parameters=YARN,
        spread=1.0,
    ),
}
# (family, switches, trust_remote_code): one engine each
ENGINES = [("llama", "cache+chunks", False), ("qwen3", "no cache, no chunks", True)]


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Each family's checkpoint directory and HF model."""
    root = tmp_path_factory.mktemp("vllm-families")
    return {name: (root / name, tiny.save_family(root / name, name, **kw)) for name, kw in FAMILIES.items()}


@pytest.fixture(scope="module")
def family_reference(family_checkpoints) -> dict[str, dict[str, Any]]:
    """HF's outputs for each family (`engines.hf_outputs`)."""
    return {name: hf_outputs(model) for name, (_, model) in family_checkpoints.items()}


def test_checkpoints_are_the_families_they_claim(family_checkpoints):
    """What the engines below are tested on: the HF classes' formats, the shapes the families differ in."""
    import json

    for name, (path, model) in family_checkpoints.items():
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == f"repo_{name}" and config["auto_map"], name
        assert config["architectures"] == [type(model).__name__], name
    llama, qwen3 = family_checkpoints["llama"][1], family_checkpoints["qwen3"][1]
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    assert llama.model.layers[1].self_attn.q_proj.bias is not None
    assert qwen3.model.layers[1].self_attn.head_dim == 64 != qwen3.config.hidden_size // 4
    assert qwen3.lm_head.weight is not qwen3.model.embed_tokens.weight


def test_plugin_registers_the_families():
    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert {"RepoLlamaForCausalLM", "RepoQwen3ForCausalLM"} <= set(ModelRegistry.get_supported_archs())


@pytest.mark.slow  # vLLM engines
@pytest.mark.parametrize("name, switches, remote_code", ENGINES, ids=[e[0] for e in ENGINES])
def test_greedy_tokens_and_prompt_logprobs_equal_hf(
    family_checkpoints, family_reference, make_llm, name, switches, remote_code
):
    """...and, where the prompt is computed in full (no prefix cache), the positions of every RePo layer."""
    path, _ = family_checkpoints[name]
    assert family_reference[name]["max_pos"] > 100, "positions should spread to hundreds"
    llm = make_llm(path, trust_remote_code=remote_code, **SWITCHES[switches])
    prefix_caching = SWITCHES[switches]["enable_prefix_caching"]
    check_against_hf(llm, name, family_checkpoints, family_reference, prefix_caching)
    if not prefix_caching:
        check_positions(llm, name, family_checkpoints, family_reference)


@pytest.mark.slow
@pytest.mark.long
def test_tensor_parallel_2_ranks_equals_hf(family_checkpoints, family_reference, make_llm, monkeypatch):
    """Qwen 3 on two real CPU ranks (a process each): each rank holds one key/value head and its two query heads,
    normed per head, and predicts that head's positions from its row of final_map."""
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"two CPU ranks need two cores; this process may use {cpus}"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    path, _ = family_checkpoints["qwen3"]
    llm = make_llm(path, tensor_parallel_size=2, **SWITCHES["cache+chunks"])
    check_against_hf(llm, "qwen3", family_checkpoints, family_reference, prefix_caching=True)


def test_qwen3_with_windows_in_some_layers_only_is_refused_at_load(tmp_path):
    """vLLM's Qwen 3 refuses it; the plugin builds Qwen 3 on Llama's model, so its config check says so instead, in
    one line, before any engine starts."""
    from vllm import LLM

    kwargs = dict(FAMILIES["qwen3"], use_sliding_window=True, sliding_window=64, max_window_layers=2)
    tiny.save_family(tmp_path / "m", "qwen3", **kwargs)
    with pytest.raises(Exception) as info:
        LLM(str(tmp_path / "m"), dtype="float32", enforce_eager=True, max_model_len=512)
    lines = [line for line in str(info.value).splitlines() if "mixes sliding-window and full" in line]
    assert len(lines) == 1, str(info.value)
