"""What the vLLM tests share: the tiny checkpoints of every position mode (`MODELS`), the engine switches, the
prompts, HF's reference outputs and the checks of an engine against them. The fixtures are in conftest.py."""

from __future__ import annotations

import math
from typing import Any

import torch

from olmo_repo.hf import record_positions

from .. import bounds
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


def prompts() -> list[list[int]]:
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


def logprob_bound(config: dict[str, Any], max_logit: float, max_pos: float) -> float:
    """|log p_vLLM - log p_HF| allowed, from fp32 rounding (`bounds.logprob_bound`) for an HF config dict."""
    return bounds.logprob_bound(config["num_hidden_layers"], config["intermediate_size"], max_logit, max_pos)


def check_against_hf(llm: Any, name: str, checkpoints, hf_reference, prefix_caching: bool) -> None:
    """Greedy tokens of `llm` on the prompts equal HF's (twice: the second pass hits the prefix cache if it is
    on), and its prompt log-probs are within `logprob_bound` of HF's."""
    from vllm import SamplingParams

    _, model = checkpoints[name]
    ref = hf_reference[name]
    if name in ("repo", "reference", "olmo3"):
        assert ref["max_pos"] > 100, "positions should spread to hundreds"
    requests = [{"prompt_token_ids": ids} for ids in prompts()]
    greedy = dict(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

    first = llm.generate(requests, SamplingParams(**greedy, prompt_logprobs=0), use_tqdm=False)
    second = llm.generate(requests, SamplingParams(**greedy), use_tqdm=False)  # prefix cache warm, if on
    for run in (first, second):
        assert [list(o.outputs[0].token_ids) for o in run] == ref["tokens"]
    cached = sum(o.num_cached_tokens or 0 for o in second)
    assert (cached > 0) == prefix_caching

    bound = logprob_bound(model.config.to_dict(), ref["max_logit"], ref["max_pos"])
    for out, ids, expected in zip(first, prompts(), ref["logprobs"]):
        got = [entry[ids[i]].logprob for i, entry in enumerate(out.prompt_logprobs) if entry is not None]
        worst = max(abs(a - b) for a, b in zip(got, expected))
        assert worst <= bound, f"{name}: prompt log-prob differs by {worst:.3g} > {bound:.3g}"


def check_positions(llm: Any, name: str, checkpoints, hf_reference) -> None:
    """The positions vLLM's RePo layers predict for the longest prompt (prefilled in one forward) equal HF's, each
    key/value head's, within the fp32 bound of `logprob_bound`'s kind (relative error of the hidden states,
    times the positions' size)."""
    from vllm import SamplingParams

    _, model = checkpoints[name]
    ids = max(prompts(), key=len)
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


def hf_outputs(model: torch.nn.Module) -> dict[str, Any]:
    """An HF model's reference outputs on `prompts()`, as conftest's `hf_reference` holds them for `MODELS`: greedy
    continuations, prompt log-probs, max |logit| and max |position| (for models built outside `MODELS`)."""
    tokens, logprobs, max_logit, max_pos = [], [], 0.0, 0.0
    for ids in prompts():
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
    return dict(tokens=tokens, logprobs=logprobs, max_logit=max_logit, max_pos=max_pos)
