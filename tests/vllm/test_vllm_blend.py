"""The index blend and the replaced positions on vLLM (issue 48): a checkpoint converted mid-anneal (p = 0.5 in its
config, f_phi trained-looking) decodes in vLLM as HF scores it, prefilled in chunks and decoded at non-zero offsets,
where the index is vLLM's `positions` (absolute, after the cached past); at p = 1, set by `hf_overrides`, a RePo
model made from the RoPE model of `engines.MODELS` gives that model's HF outputs; bad overrides are refused at load.

Both checkpoints are the "rope" model's weights with an f_phi added (RePo from layer 1), so p decides everything:
HF's log-probs at p = 0 and p = 1 differ from p = 0.5's by far more than the bound vLLM is held to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from olmo_repo.modes import index_blend
from olmo_repo.rope import repo_layers, set_index_blend

from . import tiny
from .engines import MAX_MODEL_LEN, SWITCHES, check_against_hf, hf_outputs, logprob_bound, prompts

# A run that anneals p from 1 to 0 over 100 steps, converted after 50: it scores at p = 0.5.
SCHEDULE = dict(pe_blend_init=1.0, pe_blend_steps=100)
BLEND = index_blend(1.0, 100, 50)


@pytest.fixture(scope="module")
def blended(checkpoints, tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """The mid-anneal checkpoint: the "rope" model's weights, RePo from layer 1, p = 0.5 in its config."""
    _, stock = checkpoints["rope"]
    path = tmp_path_factory.mktemp("vllm-blend") / "blend"
    model = tiny.save_repo_of(path, stock, pe_mode="repo", pe_start_layer=1, pe_blend=BLEND, **SCHEDULE)
    return {"blend": (path, model)}


@pytest.fixture(scope="module")
def blended_reference(blended) -> dict[str, dict[str, Any]]:
    return {"blend": hf_outputs(blended["blend"][1])}


def _prompt_logprobs(model: torch.nn.Module, p: float) -> torch.Tensor:
    """HF's log-probs of the longest prompt's tokens with every RePo layer at p (then back to the config's)."""
    ids = torch.tensor([max(prompts(), key=len)])
    set_index_blend(model, p)
    try:
        with torch.no_grad():
            logprobs = model(ids).logits[0, :-1].log_softmax(-1)  # [T - 1, V]
    finally:
        set_index_blend(model, model.config.pe_blend)
    return logprobs.gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.slow  # a vLLM engine
def test_a_mid_anneal_checkpoint_decodes_in_vllm_as_hf_scores_it(blended, blended_reference, make_llm):
    """Chunked prefill (64-token chunks: later chunks start at non-zero offsets), prefix-cache hits and greedy
    decode steps: HF's tokens, prompt log-probs within the fp32 bound; p matters far beyond that bound."""
    path, model = blended["blend"]
    reference = blended_reference["blend"]
    assert model.config.pe_blend == 0.5 and reference["max_pos"] > 100, "f_phi's positions spread to hundreds"
    bound = logprob_bound(model.config.to_dict(), reference["max_logit"], reference["max_pos"])
    at_half = _prompt_logprobs(model, BLEND)
    for p in (0.0, 1.0):  # a vLLM that ignored p scores as one of these
        assert (_prompt_logprobs(model, p) - at_half).abs().max() > 10 * bound, p
    llm = make_llm(path, **SWITCHES["cache+chunks"])
    assert llm.apply_model(lambda m: {layer.index_blend for layer in repo_layers(m)}) == [{BLEND}]
    check_against_hf(llm, "blend", blended, blended_reference, prefix_caching=True)


@pytest.mark.slow  # a vLLM engine
def test_at_p_one_set_by_hf_overrides_the_repo_model_scores_as_the_rope_model(
    checkpoints, hf_reference, blended, make_llm
):
    """`hf_overrides={"pe_blend": 1.0}` on the mid-anneal checkpoint: every RePo layer rotates by the token index,
    so vLLM gives the HF outputs of the RoPE model its weights came from, within the bounds of that model's own
    test (`test_vllm.py`)."""
    path, _ = blended["blend"]
    llm = make_llm(path, hf_overrides={"pe_blend": 1.0}, **SWITCHES["no cache, no chunks"])
    assert llm.apply_model(lambda m: {layer.index_blend for layer in repo_layers(m)}) == [{1.0}]
    check_against_hf(llm, "rope", checkpoints, hf_reference, prefix_caching=False)


BAD_OVERRIDES = {  # model, hf_overrides, the one line
    "blend out of range": ("blend", {"pe_blend": 1.5}, "pe_blend=1.5 is not a blend weight"),
    "unknown source": ("blend", {"pe_positions": "nope"}, "pe_positions='nope' is not supported"),
    "no RePo layer": (
        "rope",
        {"pe_positions": "index"},
        "pe_positions=index acts on the positions of RePo layers, but this model has none",
    ),
}


@pytest.mark.parametrize("case", list(BAD_OVERRIDES))
def test_bad_position_overrides_are_refused_at_load_with_one_line(checkpoints, blended, case):
    """Refused while vLLM reads the config (the plugin's config check), before any engine starts."""
    from vllm import LLM

    name, overrides, message = BAD_OVERRIDES[case]
    path, _ = {**checkpoints, **blended}[name]
    with pytest.raises(Exception) as info:
        LLM(
            str(path),
            dtype="float32",
            enforce_eager=True,
            max_model_len=MAX_MODEL_LEN,
            hf_overrides=overrides,
        )
    lines = [line for line in str(info.value).splitlines() if message in line]
    assert len(lines) == 1, str(info.value)
    assert len(lines[0]) < 400, lines[0]
