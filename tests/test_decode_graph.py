"""RePo's decode step captured whole by torch.compile(fullgraph=True) on the torch path, on CPU (issue 59, the CPU
half of its decode point): one token with the KV cache through the ai2-olmo model, and through the HF model with
transformers' static cache, each traced into one graph without a break (so without a host synchronisation or a
shape that depends on data, which would break it), giving the eager step's logits. Captured with dynamo's eager
backend (the capture is what is checked; inductor's compile of it costs seconds). CUDA graphs and the decode
timings wait for a GPU (bench/bench_repo.py, bench/bench_core.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

from olmo_repo import build_model
from olmo_repo.hf.configuration_repo_olmo2 import RepoOlmo2Config
from olmo_repo.hf.modeling_repo_olmo2 import RepoOlmo2ForCausalLM
from olmo_repo.rope import set_kernels

from .conftest import tiny_config
from .numerics import assert_within


def _close(got: torch.Tensor, want: torch.Tensor, width: int) -> None:
    """Logits of the same fp32 ops, perhaps ordered differently by the traced graph: each layer's sums of up to
    `width` terms, a few layers."""
    assert_within(got, want, roundings=8 * width, what="logits of the captured decode step")


@pytest.mark.parametrize("kernels", [None, "kernels"])  # asked for or not, tracing takes the torch path
def test_the_ai2_olmo_decode_step_is_one_graph(kernels):
    torch.manual_seed(0)
    model = build_model(tiny_config(pe_mode="repo", pe_start_layer=1, n_kv_heads=2)).eval()
    set_kernels(model, kernels)
    prompt = torch.randint(0, 100, (1, 6))
    step = torch.compile(model, fullgraph=True, backend="eager", dynamic=True)
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        past, token = out.attn_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(2):  # the cache grows: one graph for every length (dynamic shapes)
            got, want = (
                step(token, past_key_values=past, use_cache=True),
                model(token, past_key_values=past, use_cache=True),
            )
            _close(got.logits, want.logits, model.config.d_model * model.config.mlp_ratio)
            past, token = want.attn_key_values, want.logits[:, -1:].argmax(-1)


def test_the_hf_decode_step_with_the_static_cache_is_one_graph():
    torch.manual_seed(0)
    config = RepoOlmo2Config(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=128, eos_token_id=None, pe_mode="repo", pe_start_layer=1,
    )  # fmt: skip
    model = RepoOlmo2ForCausalLM(config).eval()
    prompt = torch.randint(0, 128, (1, 5))
    caches = [StaticCache(config=config, max_cache_len=8) for _ in range(2)]

    def decode(token: torch.Tensor, cache: StaticCache, position: torch.Tensor) -> torch.Tensor:
        return model(token, cache=cache, use_cache=True, cache_position=position).logits

    step = torch.compile(decode, fullgraph=True, backend="eager")
    with torch.no_grad():
        for cache in caches:
            token = model(prompt, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        position = torch.tensor([prompt.shape[1]])
        _close(step(token, caches[0], position), decode(token, caches[1], position), config.intermediate_size)
