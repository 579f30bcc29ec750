"""RePo vs RoPE on OLMo-core, side by side in one process: step time, peak step memory and decoding, MHA and GQA.

    .venv-core/bin/python bench/bench_core.py --size cpu       # OLMo 2 1B layer width, a few layers, T=512
    .venv-core/bin/python bench/bench_core.py --size gpu-1b    # OLMo 2 1B (olmo2_1B_v2) at 4096 context (CUDA)
    .venv-core/bin/python bench/bench_core.py --size gpu-1b --profile   # first: the ops only RePo runs

The model is OLMo-core's own (`TransformerConfig`, its attention backend: torch SDPA on CPU, flash 2 with CUDA when
installed), RePo through `olmo_repo.olmocore.with_position_modes`. Four variants share inputs: RoPE and RePo with
multi-head attention, and the same with grouped-query attention (4 query heads per KV head, as OLMo 2 32B has 5).
Repetitions are interleaved in a shuffled order each round; ratios are medians of the within-round ratios with a
bootstrap 95% interval (`ratios.py`). The last two lines are

    RePo/RoPE step=<ratio> memory=<ratio> decode=<ratio>              (MHA)
    RePo/RoPE GQA step=<ratio> memory=<ratio> decode=<ratio>

Decoding (seconds per new token with HF's static KV cache, prefill excluded) runs the same weights as transformers
runs them after `scripts/core_convert_to_hf.py` (`repo_olmo2` / `olmo2`, sharing the OLMo-core model's tensors):
OLMo-core itself decodes only with a flash backend (its torch backend has no KV cache), and a trained OLMo-core
model is served from its HF conversion (transformers, or vLLM: `bench/bench_vllm.py`). On CUDA RePo runs its Triton
kernels (`olmo_repo.kernels`) in training and decoding. Issue 49's targets are printed beside the ratios, with the
profile's largest RePo-only op where the step's is missed (`--profile`). The ai2-olmo side's figures come from
`make bench` (`bench/bench_repo.py`), in its own environment. `--json PATH` writes every measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from measure import (
    Profile,
    f_phi_shares,
    interleaved_rounds,
    json_file,
    micro_batch,
    peak_step_memory,
    profile_difference,
    sync,
    targets,
)
from olmo_core.nn.attention import AttentionBackendName
from olmo_core.nn.transformer import TransformerConfig
from ratios import median_ci, within_round
from transformers import StaticCache

from olmo_repo.hf.files import MODEL_CLASSES
from olmo_repo.olmocore import with_position_modes
from olmo_repo.olmocore.convert import hf_config_from_core, state_to_hf


@dataclass(frozen=True)
class Size:
    d_model: int
    n_heads: int
    n_layers: int
    pe_start_layer: int
    vocab: int
    batch: int
    seq: int
    prompt: int
    new_tokens: int
    reps: int


SIZES = {
    "tiny": Size(64, 4, 2, 1, 128, 2, 32, 16, 4, 2),  # a smoke size for tests
    "cpu": Size(2048, 16, 3, 1, 4096, 1, 512, 256, 16, 9),  # OLMo 2 1B width; RePo in 2 of 3 layers
    "gpu-1b": Size(2048, 16, 16, 5, 100352, 4, 4096, 1024, 32, 5),  # OLMo 2 1B, RePo in layers 5..15
}


def config(size: Size, pe_mode: str, kv_heads: int | None, device: str) -> TransformerConfig:
    flash = device == "cuda" and importlib.util.find_spec("flash_attn") is not None
    base = TransformerConfig.llama_like(
        d_model=size.d_model,
        vocab_size=size.vocab,
        n_layers=size.n_layers,
        n_heads=size.n_heads,
        n_kv_heads=kv_heads,
        block_name="reordered_norm",
        qk_norm=True,
        rope_theta=500_000,
        layer_norm_eps=1e-6,
        hidden_size_multiplier=1.5,
        attn_backend=AttentionBackendName.flash_2 if flash else None,
    )
    return with_position_modes(base, pe_mode, pe_start_layer=size.pe_start_layer)


def build(size: Size, pe_mode: str, kv_heads: int | None, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = config(size, pe_mode, kv_heads, device).build(init_device=device)
    model.init_weights(max_seq_len=size.seq, device=torch.device(device))
    return model


def as_hf(
    model: torch.nn.Module, size: Size, pe_mode: str, kv_heads: int | None, device: str
) -> torch.nn.Module:
    """The converted model (`scripts/core_convert_to_hf.py`'s config and weight map), on `model`'s tensors."""
    core = config(size, pe_mode, kv_heads, device)
    hf_config = hf_config_from_core(core, eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        hf = MODEL_CLASSES[type(hf_config)](hf_config)
    state = state_to_hf(hf_config, model.state_dict())
    hf.load_state_dict(state, strict=True, assign=True)
    return hf.eval()


@torch.no_grad()
def decode_time(hf: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, amp: torch.dtype | None) -> float:
    """Seconds per generated token with HF's static KV cache (a cache of fixed size, what compiled and CUDA-graph
    decoding use), prefill excluded."""
    device = prompt.device.type
    cache = StaticCache(config=hf.config, max_cache_len=prompt.shape[1] + new_tokens)
    with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
        token = hf(prompt, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        sync(device)
        start = time.perf_counter()
        for _ in range(new_tokens):
            token = hf(token, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        sync(device)
    return (time.perf_counter() - start) / new_tokens


def step(model: torch.nn.Module, ids: torch.Tensor, amp: torch.dtype | None) -> None:
    with torch.autocast(ids.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        logits = model(ids[:, :-1])
    F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=True)


def run(size_name: str, reps: int | None, device: str) -> dict:
    size = SIZES[size_name]
    amp = torch.bfloat16 if device == "cuda" else None
    kv = size.n_heads // 4
    variants = {
        "rope": ("rope", None),
        "repo": ("repo", None),
        "rope-gqa": ("rope", kv),
        "repo-gqa": ("repo", kv),
    }
    models = {name: build(size, mode, heads, device) for name, (mode, heads) in variants.items()}
    hf = {name: as_hf(models[name], size, mode, heads, device) for name, (mode, heads) in variants.items()}
    ids = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=device)
    prompt = torch.randint(0, size.vocab, (1, size.prompt), device=device)
    for name, model in models.items():  # warm-up
        step(model, ids, amp)
        decode_time(hf[name], prompt, 1, amp)
    times, decode = interleaved_rounds(
        {name: lambda m=m: step(m, ids, amp) for name, m in models.items()},
        {name: lambda m=m: decode_time(m, prompt, size.new_tokens, amp) for name, m in hf.items()},
        reps or size.reps,
        device,
        random.Random(0),
    )
    memory = {name: peak_step_memory(lambda m=m: step(m, ids, amp), m, device) for name, m in models.items()}
    out = {"size": size_name, "batch": size.batch, "device": device, "machine": platform.processor() or platform.machine(), "times": times,
           "decode_s_per_token": decode, "memory": memory, "ratios": {}, "shares": {}}  # fmt: skip
    for repo, rope in (("repo", "rope"), ("repo-gqa", "rope-gqa")):
        ratios = within_round(times[repo], times[rope])
        out["ratios"][repo] = {
            "step": statistics.median(ratios),
            "step_ci": median_ci(ratios),
            "memory": memory[repo] / memory[rope],
            "decode": statistics.median(within_round(decode[repo], decode[rope])),
        }
        out["shares"][repo] = f_phi_shares(models[repo], models[rope])
    return out


def profile(size_name: str, kv_heads: int | None, device: str) -> Profile:
    """`measure.profile_difference` of one training step of OLMo-core's RoPE and RePo models."""
    size = SIZES[size_name]
    amp = torch.bfloat16 if device == "cuda" else None
    ids = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=device)

    def step_of(mode: str):
        model = build(size, mode, kv_heads, device)
        return lambda: step(model, ids, amp)

    return profile_difference(step_of, device)


def report(result: dict) -> str:
    lines = [f"OLMo-core, size {result['size']} on {result['device']} ({result['machine']})"]
    for name, values in result["times"].items():
        lines.append(
            f"  {name:9s} step {statistics.median(values) * 1e3:9.2f} ms  peak {result['memory'][name] / 2**20:8.1f} MiB"
            f"  decode {statistics.median(result['decode_s_per_token'][name]) * 1e3:8.2f} ms/token"
        )
    for repo in ("repo", "repo-gqa"):
        low, high = result["ratios"][repo]["step_ci"]
        lines.append(f"  {repo}/rope step 95% interval {low:.4f}..{high:.4f}")
    for repo, label in (("repo", "RePo/RoPE"), ("repo-gqa", "RePo/RoPE GQA")):
        r = result["ratios"][repo]
        lines.append(f"{label} step={r['step']:.4f} memory={r['memory']:.4f} decode={r['decode']:.4f}")
    return "\n".join(lines)


def target_report(result: dict, profiles: dict[str, Profile]) -> str:
    """`measure.targets` for MHA and GQA, the step's missed target held by the profile's largest RePo-only op."""
    lines = []
    for repo in ("repo", "repo-gqa"):
        own = profiles[repo].own if repo in profiles else []
        held = {"step": f"the profile's largest RePo-only op: {own[0][0]} ({own[0][2]:.2%})"} if own else {}
        lines += [f"{repo}:", targets(result["ratios"][repo], result["shares"][repo], held)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size", choices=list(SIZES), default="cpu", help="model and batch shape (default: cpu)"
    )
    parser.add_argument("--reps", type=int, default=None, help="rounds (default: the size's)")
    parser.add_argument(
        "--batch",
        type=micro_batch,
        default=None,
        help="micro-batch, in sequences of the size's length (default: the size's)",
    )
    parser.add_argument("--json", type=json_file, default=None, help="write every measurement to this file")
    parser.add_argument(
        "--profile", action="store_true", help="first print the per-op time RePo adds over RoPE (MHA, GQA)"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.size == "gpu-1b" and device != "cuda":
        parser.error("--size gpu-1b needs CUDA")
    if args.batch is not None:
        SIZES[args.size] = dataclasses.replace(SIZES[args.size], batch=args.batch)
    profiles = {}
    if args.profile:
        for repo, kv in (("repo", None), ("repo-gqa", SIZES[args.size].n_heads // 4)):
            profiles[repo] = profile(args.size, kv, device)
            print(f"{repo}: {profiles[repo].text}")
    result = run(args.size, args.reps, device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(target_report(result, profiles))
    print(report(result))


if __name__ == "__main__":
    main()
