"""RePo vs the same weights as RoPE in vLLM, side by side in one run: prefill and decode tokens/s, batch 1 and 16.

    .venv-vllm/bin/python bench/bench_vllm.py --size cpu       # make bench-vllm: 8 layers of width 512, bf16
    .venv-vllm/bin/python bench/bench_vllm.py --size cpu-1b-width   # 4 layers of the 1B's width, bf16
    python bench/bench_vllm.py --size gpu-1b                   # the OLMo-2 1B shape, bf16, RePo in 5..15 (CUDA)

Both checkpoints are written once from the same random weights: the RePo one (`repo_olmo2`, RePo in the
paper's layers, f_phi weights drawn so that positions spread over hundreds) and the RoPE one (a plain `olmo2`
config over the same tensors minus f_phi). Both engines are up at once in this process (with an engine-core
process each, prefill ran at about half the rate here), and every round times both on the same prompts in a
shuffled order, so drift of a shared machine hits both alike. (Timed one after the other, other jobs on the
2-core machine alone moved one engine's decode rate 4x.)
Prefix caching is off: every prompt is computed. Prefill: `prompt` tokens per sequence, one generated token.
Decode: generating `decode` tokens after a 32-token prompt, minus generating one, per token.

Each mode (`--modes`: `compiled`, vLLM's default, torch.compile and on GPU CUDA graphs; `eager`,
enforce_eager, what `scripts/eval.py --backend vllm` runs on CPU) prints tokens/s (medians over the rounds)
and the ratio RePo/RoPE of seconds per token, with a bootstrap 95% interval. The rounds come in two halves,
each with the engines built in the opposite order (the one built first in a process ran up to 30% slower in
some runs); the ratio is the median over pairs (round i of each half) of the geometric mean of the two
within-round ratios. A shared machine's noise (+-5-10% per run on the 2-core VM) hides a difference of a
few percent there, so each mode also times, inside each engine (`LLM.apply_model`) and many times over, the one
step in which a RePo layer differs from a RoPE layer: `RepoOlmo2Attention.rotate` (f_phi and the rotation)
against vLLM's `rotary_emb(positions, q, k)`, compiled when the engine compiles. Their difference times the
RePo layers, over RoPE's decode step, is the *accounted* decode ratio. Decode target: <= 1.02 (the paper, on
a GPU: +3.4%). `--json PATH` writes every measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # both engines in this process
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the tables and progress bars, not engine logs

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import Olmo2Config  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import json_file  # noqa: E402
from ratios import median_ci, within_round  # noqa: E402

from olmo_repo.hf import RepoOlmo2Config, RepoOlmo2ForCausalLM  # noqa: E402
from olmo_repo.modes import F_PHI_WEIGHTS  # noqa: E402

SIZES = {
    "cpu": dict(
        model=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                   vocab_size=8192, pe_start_layer=3),
        dtype="bfloat16", prompt=512, decode=64, batches=(1, 16), rounds=8, kv_gib=2,
    ),
    # the OLMo-2 1B layer width, 4 layers, RePo in 3 (the 1B has it in 11 of 16): RePo's per-layer cost
    # against a layer of real size, on a CPU
    "cpu-1b-width": dict(
        model=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=16,
                   vocab_size=8192, pe_start_layer=1),
        dtype="bfloat16", prompt=64, decode=32, batches=(1, 16), rounds=6, kv_gib=2,
    ),
    # the same with grouped-query attention, 4 query heads per key/value head
    "cpu-1b-width-gqa": dict(
        model=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=16,
                   num_key_value_heads=4, vocab_size=8192, pe_start_layer=1),
        dtype="bfloat16", prompt=64, decode=32, batches=(1, 16), rounds=6, kv_gib=2,
    ),
    "gpu-1b": dict(
        model=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                   vocab_size=100352, pe_start_layer=5),
        dtype="bfloat16", prompt=4096, decode=256, batches=(1, 16), rounds=6, kv_gib=None,
    ),
}  # fmt: skip


def write_models(root: Path, shape: dict, dtype: torch.dtype) -> tuple[Path, Path]:
    """The RePo checkpoint (the project's HF model) and the RoPE checkpoint of the same weights minus f_phi
    (a plain `olmo2`); tokenizer-free: ids only. Weights: N(0, 1/fan_in), norms 1, embeddings N(0, 1), f_phi
    drawn so that positions spread over hundreds."""
    common = dict(
        **{k: v for k, v in shape.items() if k not in ("pe_start_layer", "num_key_value_heads")},
        num_key_value_heads=shape.get("num_key_value_heads", shape["num_attention_heads"]),
        max_position_embeddings=8192, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
    )  # fmt: skip
    config = RepoOlmo2Config(**common, pe_mode="repo", pe_start_layer=shape["pe_start_layer"])
    model = RepoOlmo2ForCausalLM(config).to(dtype)
    gen = torch.Generator().manual_seed(0)
    std = {"gate_map": 0.5, "content_map": 0.5, "final_map": 0.25, "embed_tokens": 1.0}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            s = next((v for k, v in std.items() if f".{k}." in name), param.shape[1] ** -0.5)
            param.copy_(torch.randn(param.shape, generator=gen) * s)
    repo, rope = root / "repo", root / "rope"
    model.save_pretrained(repo)
    tensors = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 2)[-2] not in F_PHI_WEIGHTS}
    rope.mkdir()
    save_file(tensors, rope / "model.safetensors")
    raw = {**Olmo2Config(**common).to_dict(), "architectures": ["Olmo2ForCausalLM"], "dtype": str(dtype)[6:]}
    (rope / "config.json").write_text(json.dumps(raw, indent=2))
    return repo, rope


def engine(path: Path, size: dict, mode: str):
    from vllm import LLM

    return LLM(str(path), enforce_eager=mode == "eager", dtype=size["dtype"], seed=0,
               max_model_len=size["prompt"] + size["decode"] + 16, enable_prefix_caching=False,
               max_num_seqs=max(size["batches"]), skip_tokenizer_init=True,
               max_num_batched_tokens=max(size["batches"]) * (size["prompt"] + 16))  # fmt: skip


def per_call(fn: Callable[..., object], args: tuple, reps: int, sync: Callable[[], None]) -> float:
    """Median seconds per call of fn(*args) over `reps` timings of 50 calls, after 20 warm-up calls."""
    with torch.inference_mode():
        for _ in range(20):
            fn(*args)
        times = []
        for _ in range(reps):
            sync()
            start = time.perf_counter()
            for _ in range(50):
                fn(*args)
            sync()
            times.append((time.perf_counter() - start) / 50)
    return statistics.median(times)


def piece_times(
    model: torch.nn.Module, layer: int, batches: tuple[int, ...], reps: int, compiled: bool
) -> dict[str, float]:
    """Run in the engine (`LLM.apply_model`): seconds per call of what layer `layer` runs in place of the other
    model's, at each decode batch: RePo's `rotate` (f_phi and the rotation of q and k) or RoPE's
    `rotary_emb(positions, q, k)`, on the engine's own modules and weights (median of `reps` x 50), through
    torch.compile when the engine compiles (inductor fuses it into the model's graph there). In a RePo layer
    also f_phi's gate_map product [batch, d] x [d, d/8] alone, with fp32 inputs (as f_phi runs it on CPU) and
    with bf16 inputs and output (the rate of a bf16 GEMM; f_phi does not round its output so)."""
    attention = model.model.layers[layer].self_attn

    def piece(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> object:
        if attention.pe_mode == "repo":
            return attention.rotate(x, q, k)
        return attention.rotary_emb(positions, q, k)

    run = torch.compile(piece, dynamic=False) if compiled else piece
    out = {}
    weight = attention.qkv_proj.weight
    sync = torch.cuda.synchronize if weight.is_cuda else lambda: None
    for batch in batches:
        x, q, k = (torch.randn(batch, n, dtype=weight.dtype, device=weight.device)
                   for n in (model.config.hidden_size, attention.q_size, attention.kv_size))  # fmt: skip
        out[f"decode_b{batch}"] = per_call(
            run, (x, q, k, torch.arange(batch, device=weight.device) + 100), reps, sync
        )
        if attention.pe_mode == "repo":
            gate = attention.gate_map.weight
            for dtype in (torch.float32, torch.bfloat16):
                args = (x.to(dtype), gate.to(dtype).t())
                out[f"gemm_{str(dtype)[6:]}_decode_b{batch}"] = per_call(torch.mm, args, reps, sync)
    return out


def generate(llm: object, prompts: list[list[int]], new: int) -> float:
    """Seconds to generate `new` tokens greedily after each of `prompts`, as one batch."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)  # type: ignore[attr-defined]
    return time.perf_counter() - start


def measure(paths: dict[str, Path], size: dict, mode: str, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per token of prefill and decode at each batch size, and of the differing step (`piece_*`), per
    model and round ([name][key][round]).

    The rounds come in two halves, each with a fresh pair of engines built in the opposite order: in one process
    the engine built first decoded up to 30% slower than the second in some runs on the 2-core VM (eager), and
    `report` pairs round i of one half with round i of the other, which cancels that."""
    from olmo_repo.upstream.vllm import cleanup_dist_env_and_memory

    gen = torch.Generator().manual_seed(1)
    order = random.Random(0)
    times: dict[str, dict[str, list[float]]] = {name: {} for name in paths}
    new = size["decode"]
    layer = size["model"]["pe_start_layer"]  # the first RePo layer, and the RoPE model's layer in its place
    progress = tqdm(total=rounds, desc=f"{mode}: rounds", file=sys.stderr)
    for built in (list(paths), list(paths)[::-1]):
        engines = {name: engine(paths[name], size, mode) for name in built}
        vocab = engines["rope"].llm_engine.model_config.get_vocab_size()

        def prompts(batch: int, length: int, vocab: int = vocab) -> list[list[int]]:
            return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(batch)]

        for llm in engines.values():  # warm-up: kernels, allocator, compiled graphs for these shapes
            for batch in size["batches"]:
                generate(llm, prompts(batch, size["prompt"]), 1), generate(llm, prompts(batch, 32), new + 1)
        for _ in range(rounds // 2):
            names = list(engines)
            for batch in size["batches"]:
                long, short = prompts(batch, size["prompt"]), prompts(batch, 32)  # the same for both models
                order.shuffle(names)
                for name in names:
                    llm = engines[name]
                    prefill = generate(llm, long, 1)
                    decode = generate(llm, short, new + 1) - generate(llm, short, 1)
                    times[name].setdefault(f"prefill_b{batch}", []).append(prefill / (batch * size["prompt"]))
                    times[name].setdefault(f"decode_b{batch}", []).append(decode / (batch * new))
            order.shuffle(names)
            for name in names:
                pieces = engines[name].apply_model(partial(
                    piece_times, layer=layer, batches=size["batches"], reps=5, compiled=mode == "compiled"
                ))  # fmt: skip
                for key, seconds in pieces[0].items():
                    times[name].setdefault(f"piece_{key}", []).append(seconds)
            progress.update()
        for llm in engines.values():
            llm.llm_engine.engine_core.shutdown()
        engines.clear()
        gc.collect()
        cleanup_dist_env_and_memory()
    progress.close()
    return times


def report(times: dict[str, dict[str, list[float]]], size: dict) -> tuple[str, dict[str, dict[str, float]]]:
    """The table of one mode, and its ratios {key: {ratio, ci95_low, ci95_high}} (and `accounted_decode_bN`)."""
    lines = [f"{'':12}{'RePo tok/s':>12}{'RoPE tok/s':>12}{'RePo/RoPE s/token':>20}{'95% interval':>16}"]
    ratios: dict[str, dict[str, float]] = {}
    for key, repo in times["repo"].items():
        if key.startswith("piece_"):
            continue
        per_round = within_round(repo, times["rope"][key])
        half = len(per_round) // 2  # round i of the first half pairs with round i of the second (other order)
        pairs = [math.sqrt(a * b) for a, b in zip(per_round[:half], per_round[half:])]
        ratio, (low, high) = statistics.median(pairs), median_ci(pairs)
        ratios[key] = dict(ratio=ratio, ci95_low=low, ci95_high=high)
        rates = (1 / statistics.median(repo), 1 / statistics.median(times["rope"][key]))
        lines.append(f"{key:12}{rates[0]:12.1f}{rates[1]:12.1f}{ratio:20.3f}{f'{low:.3f}-{high:.3f}':>16}")
    n_repo = size["model"]["num_hidden_layers"] - size["model"]["pe_start_layer"]
    lines.append(f"accounted: what a RePo layer runs instead of RoPE's rotary embedding, timed alone, "
                 f"times {n_repo} RePo layers, over RoPE's decode step")  # fmt: skip
    for batch in size["batches"]:
        key = f"decode_b{batch}"
        repo_piece = statistics.median(times["repo"][f"piece_{key}"])
        rope_piece = statistics.median(times["rope"][f"piece_{key}"])
        step = statistics.median(times["rope"][key]) * batch  # seconds per decode step
        accounted = 1 + n_repo * (repo_piece - rope_piece) / step
        ratios[f"accounted_{key}"] = dict(ratio=accounted, repo_piece_s=repo_piece, rope_piece_s=rope_piece)
        lines.append(f"{key:12}RePo {repo_piece * 1e6:.1f} us, RoPE {rope_piece * 1e6:.1f} us per layer; "
                     f"step {step * 1e3:.2f} ms; accounted RePo/RoPE {accounted:.3f}")  # fmt: skip
        gemm = {d: statistics.median(times["repo"][f"piece_gemm_{d}_{key}"]) for d in ("float32", "bfloat16")}
        ratios[f"f_phi_gemm_{key}"] = {f"{d}_s": t for d, t in gemm.items()}
        lines.append(f"{'':12}f_phi's gate_map product alone: {gemm['float32'] * 1e6:.1f} us in fp32 (what f_phi "
                     f"runs on CPU), {gemm['bfloat16'] * 1e6:.1f} us in bf16")  # fmt: skip
    return "\n".join(lines), ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu", help="model and batch shape")
    parser.add_argument("--modes", default="compiled,eager",
                        help="comma list of compiled (vLLM's default) and eager (enforce_eager)")  # fmt: skip
    parser.add_argument("--rounds", type=int,
                        help="timed rounds per mode, even: half with each engine built first (default: the size's)")  # fmt: skip
    parser.add_argument("--json", type=json_file, help="also write every measurement here")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    modes = args.modes.split(",")
    if unknown := set(modes) - {"compiled", "eager"}:
        parser.error(f"--modes: unknown mode {sorted(unknown)[0]!r} (compiled, eager)")
    rounds = args.rounds or size["rounds"]
    if rounds < 2 or rounds % 2:
        parser.error(
            f"--rounds={rounds}: must be even and >= 2 (half the rounds with each engine built first)"
        )
    if size["kv_gib"]:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(size["kv_gib"]))
    load = os.getloadavg()[0]
    results: dict = {"size": args.size, "shape": size, "load_before": load, "modes": {}}
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        repo_dir, rope_dir = write_models(Path(tmp), size["model"], getattr(torch, size["dtype"]))
        for mode in modes:
            times = measure({"repo": repo_dir, "rope": rope_dir}, size, mode, rounds)
            table, ratios = report(times, size)
            tables.append(f"{mode}:\n{table}")
            results["modes"][mode] = {"s_per_token": times, "ratio_s_per_token": ratios}
    results["load_after"] = os.getloadavg()[0]
    import vllm

    print(f"\nvLLM {vllm.__version__}, size {args.size} ({size['model']}, {size['dtype']}), prompt {size['prompt']}, decode "
          f"{size['decode']} tokens, {rounds} rounds; load average {load:.2f} before, "
          f"{results['load_after']:.2f} after")  # fmt: skip
    print("\n".join(tables))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
