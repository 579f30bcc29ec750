"""RePo vs RoPE vs NoPE, side by side in one process: step time, peak step memory, decode time per token.

    .venv/bin/python bench/bench_repo.py --size cpu,cpu-gqa  # OLMo-2 1B layer width, a few layers, T=512;
                                                             # multi-head, then grouped-query (make bench)
    .venv/bin/python bench/bench_repo.py --size gpu-1b       # the full 1B shape at 4096 context (CUDA)

Variants share the base weights and the inputs; repetitions are interleaved in a shuffled order each round,
so drift of a shared machine hits every variant alike. `repo-reference` is RePo with the reference
implementation's approach to rotation: per-head fp32 cos/sin tables [B, H, T, d] built by autograd and kept
for backward (`olmo_repo.rotation.rotate_reference`). The GPU sizes time RoPE, RePo (with its Triton kernels) and
`repo-torch`, RePo without them (the torch code: `olmo_repo.rope.set_kernels(model, "torch")`). Several sizes run one
after the other in the same process
(`--size cpu,cpu-gqa`: multi-head and grouped-query attention) and end with a side-by-side table. The last
printed line (one per size, named in brackets when there are several) is

    RePo/RoPE step=<ratio> memory=<ratio> decode=<ratio>

Time ratios are medians over the rounds of the ratio measured within a round, with a bootstrap 95% interval;
memory is measured once (it does not vary). On a shared machine whole steps vary by several percent, so the
benchmark also times, alone and many times over, the pieces in which a RePo layer differs from a RoPE layer
(f_phi and the rotation against OLMo's rotary embedding, each forward+backward) and reports their sum over
the RePo layers as a share of the RoPE step: the overhead the implementation accounts for, resolved to a
fraction of a percent. Issue 49's targets (the 1B on one H200) are printed beside the measured ratios, and where
one is missed, what holds it. `--json PATH` writes every measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator
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
    timed,
)
from olmo.model import OLMo
from ratios import median_ci, within_round
from tqdm import tqdm

import olmo_repo.rope
from olmo_repo import RepoModelConfig, build_model, olmo2_model_config
from olmo_repo.kernels import select
from olmo_repo.modes import is_f_phi_param
from olmo_repo.rope import set_kernels
from olmo_repo.rotation import rotate_reference


@dataclass(frozen=True)
class Size:
    d_model: int
    n_heads: int
    n_layers: int
    pe_start_layer: int
    mlp_ratio: int
    vocab: int
    batch: int
    seq: int
    prompt: int
    new_tokens: int
    reps: int
    n_kv_heads: int | None = None  # grouped-query attention: fewer key/value heads (None: n_heads)
    variants: tuple[str, ...] = ("rope", "repo", "nope", "repo-reference")


GPU = (
    "rope",
    "repo",
    "repo-torch",
)  # RoPE, RePo, and RePo without its kernels (all a 9-minute GPU run affords)
MODES = {"rope": "rope", "repo": "repo", "nope": "nope", "repo-reference": "repo", "repo-torch": "repo"}


SIZES = {
    # Smoke sizes for tests.
    "tiny": Size(64, 4, 2, 1, 4, 128, 2, 32, 16, 4, 2),
    "tiny-gqa": Size(64, 4, 2, 1, 4, 128, 2, 32, 16, 4, 2, n_kv_heads=2),
    # OLMo-2 1B layer width and heads; RePo in 2 of 3 layers (the 1B has 11 of 16). The vocabulary is cut to
    # 4096 so that the output layer does not dwarf three blocks (in the 1B, 16 blocks outweigh it 5:1).
    "cpu": Size(2048, 16, 3, 1, 8, 4096, 1, 512, 256, 16, 9),
    # The same with grouped-query attention, 4 query heads per key/value head (OLMo 2 32B has 5).
    "cpu-gqa": Size(2048, 16, 3, 1, 8, 4096, 1, 512, 256, 16, 9, n_kv_heads=4),
    # The full OLMo-2 1B at micro-batch 4 x 4096, RePo in layers 5..15; and with 4 key/value heads.
    "gpu-1b": Size(2048, 16, 16, 5, 8, 100278, 4, 4096, 1024, 32, 5, variants=GPU),
    "gpu-1b-gqa": Size(2048, 16, 16, 5, 8, 100278, 4, 4096, 1024, 32, 5, n_kv_heads=4, variants=GPU),
}


def model_config(size: Size, pe_mode: str, device: str) -> RepoModelConfig:
    return olmo2_model_config(
        d_model=size.d_model,
        n_heads=size.n_heads,
        n_kv_heads=size.n_kv_heads,
        n_layers=size.n_layers,
        mlp_ratio=size.mlp_ratio,
        flash_attention=device == "cuda" and importlib.util.find_spec("flash_attn") is not None,
        max_sequence_length=max(size.seq, size.prompt + size.new_tokens),
        vocab_size=size.vocab,
        embedding_size=(size.vocab + 127) // 128 * 128,
        init_device=device,
        pe_mode=pe_mode,
        pe_start_layer=0 if pe_mode == "nope" else size.pe_start_layer,
    )


@contextlib.contextmanager
def reference_rotation(enabled: bool) -> Iterator[None]:
    """Swap the RePo layer's rotation for the reference approach (materialised per-head cos/sin tables), in
    training (`rotate_qk`) and decoding (`rotate_forward`)."""
    originals = olmo_repo.rope.rotate_qk, olmo_repo.rope.rotate_forward
    if enabled:
        olmo_repo.rope.rotate_qk = lambda q, k, z, f, compiled=None: (
            rotate_reference(q, z, f),
            rotate_reference(k, z, f),
        )
        olmo_repo.rope.rotate_forward = lambda z, f, xs: [rotate_reference(x, z, f) for x in xs]
    try:
        yield
    finally:
        olmo_repo.rope.rotate_qk, olmo_repo.rope.rotate_forward = originals


TORCH_PATH = ("repo-reference", "repo-torch")
"""Variants whose RePo layers run the torch code (`set_kernels(model, "torch")`): RePo's torch code, and the
reference's rotation (swapped into the torch code, which RePo's kernels would otherwise replace on CUDA)."""


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """What a variant runs besides its model: `repo-reference` the reference's rotation."""
    with reference_rotation(name == "repo-reference"):
        yield


def train_step(model: OLMo, ids: torch.Tensor, amp: torch.dtype | None) -> None:
    with torch.autocast(ids.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        logits = model(ids[:, :-1]).logits
    loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)


@torch.no_grad()
def decode_time(
    model: OLMo, prompt: torch.Tensor, new_tokens: int, amp: torch.dtype | None, device: str
) -> float:
    """Seconds per generated token with the KV cache (prefill excluded)."""
    with torch.autocast(prompt.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        out = model(prompt, use_cache=True, last_logits_only=True)
        past, token = out.attn_key_values, out.logits.argmax(-1)
        sync(device)
        start = time.perf_counter()
        for _ in range(new_tokens):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.attn_key_values, out.logits[:, -1:].argmax(-1)
        sync(device)
    return (time.perf_counter() - start) / new_tokens


def saved_activation_memory(model: OLMo, ids: torch.Tensor, amp: torch.dtype | None) -> int:
    """Bytes that autograd keeps from the forward for the backward, weights excluded (unique storages)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(ids.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            logits = model(ids[:, :-1]).logits
    del logits
    return sum(saved.values())


def spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med * 1e3:9.2f} ms (±{(max(values) - min(values)) / 2 / med * 100:4.1f}%)"


def component_times(
    repo_block: torch.nn.Module, rope_block: torch.nn.Module, size: Size, amp: torch.dtype | None, device: str
) -> dict[str, list[float]]:
    """Seconds of what one RePo layer does instead of a RoPE layer's rotation, at the benchmark's shape, each piece
    alone, interleaved, forward+backward: f_phi and RePo's rotation of q and k as the layer runs them on this
    device (on CUDA RePo's kernels: `f_phi`, `rotation-kernel`; f_phi without them: `f_phi-torch`), the torch
    rotation eager and through torch.compile (what CUDA ran before the kernels), the reference's rotation, and
    OLMo's rotary embedding (what a RoPE layer does instead); with grouped-query attention q has n_heads and k
    n_kv_heads heads. And `decode`: f_phi and the rotation at one token without autograd, as a decode step runs
    them."""
    B, T, H, d = size.batch, size.seq, size.n_heads, size.d_model
    n_kv, hd = size.n_kv_heads or H, d // H
    dtype = amp or torch.float32
    x = torch.randn(B, T, d, device=device, requires_grad=True)
    q = torch.randn(B, H, T, hd, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(B, n_kv, T, hd, device=device, dtype=dtype, requires_grad=True)
    positions = (torch.rand(B, n_kv, T, device=device) * T).requires_grad_()
    grads = {t.shape: torch.randn(t.shape, device=device, dtype=dtype) for t in (q, k)}

    def backward(*outs: torch.Tensor) -> None:
        torch.autograd.backward(outs, [grads.get(o.shape, torch.ones_like(o)) for o in outs])

    def autocast():
        return torch.autocast(device, dtype=dtype, enabled=amp is not None)

    def f_phi(kernels: str | None) -> Callable[[], None]:
        def go() -> None:
            set_kernels(repo_block, kernels)
            with autocast():
                z = repo_block.predict_positions(x)
            backward(z)

        return go

    def rotation(kernels: str | None, compiled: bool | None = None) -> Callable[[], None]:
        def go() -> None:
            set_kernels(repo_block, kernels)
            with autocast():
                outs = repo_block.apply_positions(q, k, positions, compiled=compiled)
            backward(*outs)

        return go

    def reference() -> None:
        set_kernels(repo_block, "torch")
        with autocast(), variant("repo-reference"):
            outs = repo_block.apply_positions(q, k, positions)
        backward(*outs)

    def rope() -> None:
        with autocast():
            outs = rope_block.rotary_emb(q, k)
        backward(*outs)

    def decode() -> None:
        set_kernels(repo_block, None)
        with torch.no_grad(), autocast():
            repo_block.apply_positions(q[:1, :, :1], k[:1, :, :1], repo_block.predict_positions(x[:1, :1]))

    pieces = {"f_phi": f_phi(None)}
    if select.runs(None, q, k, positions):
        pieces |= {"f_phi-torch": f_phi("torch"), "rotation-kernel": rotation(None)}
    pieces |= {
        "rotation-eager": rotation("torch", compiled=False),
        "rotation-compiled": rotation("torch", compiled=True),
        "rotation-reference": reference,
        "rope-rotary": rope,
        "decode": decode,
    }
    for fn in pieces.values():
        fn()
    samples: dict[str, list[float]] = {n: [] for n in pieces}
    order = list(pieces)
    for _ in tqdm(range(max(20, 4 * size.reps)), desc="pieces of a RePo layer", unit="round"):
        random.shuffle(order)
        for name in order:
            samples[name].append(timed(pieces[name], device))
    set_kernels(repo_block, None)
    return samples


def memory_figures(
    models: dict[str, OLMo],
    step: Callable[[str], Callable[[], None]],
    ids: torch.Tensor,
    amp: torch.dtype | None,
    device: str,
) -> tuple[dict[str, int], dict[str, int]]:
    """({name: peak step memory}, {name: saved activation bytes}) of every model; on CUDA one model on the GPU at a
    time (four 1.5B models' forwards ran out of 139 GiB), the others parked on the CPU."""
    memory, activations = {}, {}
    for name in models:
        if device == "cuda":
            for other, model in models.items():
                model.to(device if other == name else "cpu")
            torch.cuda.empty_cache()
        memory[name] = peak_step_memory(step(name), models[name], device)
        with variant(name):
            activations[name] = saved_activation_memory(models[name], ids, amp)
    return memory, activations


def run(size_name: str, reps: int | None, device: str, seed: int = 0) -> dict:
    size = SIZES[size_name]
    reps = reps or size.reps
    amp = torch.bfloat16 if device == "cuda" else None
    variants = size.variants
    models = {}
    for name in variants:
        torch.manual_seed(seed)  # same base weights for every variant
        models[name] = build_model(model_config(size, MODES[name], device)).train()
        if name in TORCH_PATH:
            set_kernels(models[name], "torch")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=device)
    prompt = torch.randint(0, size.vocab, (1, size.prompt), device=device)

    def step(name: str) -> Callable[[], None]:
        def go() -> None:
            with variant(name):
                train_step(models[name], ids, amp)

        return go

    for name in variants:  # warm-up: allocator, kernels, autotuning
        step(name)()

    def decode(name: str) -> Callable[[], float]:
        def go() -> float:
            models[name].eval()
            with variant(name):
                seconds = decode_time(models[name], prompt, size.new_tokens, amp, device)
            models[name].train()
            return seconds

        return go

    step_s, decode_s = interleaved_rounds(
        {n: step(n) for n in variants}, {n: decode(n) for n in variants}, reps, device, random.Random(seed)
    )
    # The times first, so that a failure in the memory figures below leaves them in the log.
    tqdm.write(f"{size_name}: step and decode vs RoPE (medians of within-round ratios): " + ", ".join(
        f"{n} {statistics.median(within_round(step_s[n], step_s['rope'])):.4f} "
        f"{statistics.median(within_round(decode_s[n], decode_s['rope'])):.4f}" for n in variants if n != "rope"
    ))  # fmt: skip
    memory, activations = memory_figures(models, step, ids, amp, device)
    if device == "cuda":
        models["repo"].to(device), models["rope"].to(device)  # the pieces below time their blocks

    layer = size.pe_start_layer  # the first RePo layer, and the RoPE model's layer in its place
    components = component_times(
        models["repo"].transformer.blocks[layer], models["rope"].transformer.blocks[layer], size, amp, device
    )
    return {
        "size": size_name,
        "shape": size.__dict__,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "kernels": kernels_in_use(device),
        "step_s": step_s,
        "decode_s_per_token": decode_s,
        "peak_step_memory_bytes": memory,
        "saved_activation_bytes": activations,
        "f_phi_bytes": sum(p.numel() * p.element_size() for n, p in models["repo"].named_parameters()
                           if is_f_phi_param(n)),
        "shares": f_phi_shares(models["repo"], models["rope"]),
        "component_s": components,
        "accounted_step_ratio": accounted(components, size, statistics.median(step_s["rope"])),
        "ratios_vs_rope": {
            n: {
                "step": statistics.median(within_round(step_s[n], step_s["rope"])),
                "step_ci95": median_ci(within_round(step_s[n], step_s["rope"])),
                "memory": memory[n] / memory["rope"],
                "activations": activations[n] / activations["rope"],
                "decode": statistics.median(within_round(decode_s[n], decode_s["rope"])),
            }
            for n in variants
        },
    }  # fmt: skip


def kernels_in_use(device: str) -> str | None:
    """The Triton version whose kernels RePo runs on `device`, or None (the torch code: CPU)."""
    if not select.runs(None, torch.zeros(1, device=device)):
        return None
    import triton

    return triton.__version__


def accounted(components: dict[str, list[float]], size: Size, rope_step: float) -> dict[str, float]:
    """1 + (f_phi + RePo's rotation - OLMo's rotary embedding) x the RePo layers / the RoPE step, from the pieces'
    medians: for RePo as it runs here (on CUDA its kernels), RePo's torch code on CUDA (compiled rotation; where
    the kernels run), and the reference's rotation."""
    piece = {n: statistics.median(v) for n, v in components.items()}
    layers = size.n_layers - size.pe_start_layer

    def ratio(f_phi: str, rotation: str) -> float:
        return 1 + layers * (piece[f_phi] + piece[rotation] - piece["rope-rotary"]) / rope_step

    if "rotation-kernel" not in piece:  # CPU: the torch code, eager
        return {
            "repo": ratio("f_phi", "rotation-eager"),
            "repo-reference": ratio("f_phi", "rotation-reference"),
        }
    return {
        "repo": ratio("f_phi", "rotation-kernel"),
        "repo-torch": ratio("f_phi-torch", "rotation-compiled"),
        "repo-reference": ratio("f_phi-torch", "rotation-reference"),
    }


def target_report(result: dict, profile: Profile | None) -> str:
    """`measure.targets` for RePo against RoPE, with what holds each one missed (`held_by`)."""
    return targets(result["ratios_vs_rope"]["repo"], result["shares"], held_by(result, profile))


def held_by(result: dict, profile: Profile | None) -> dict[str, str]:
    """What holds each target, should it be missed: the pieces' shares of the step (and the profile's largest
    RePo-only op), the saved activations and f_phi's weights, f_phi and the rotation per decoded token."""
    size = SIZES[result["size"]]
    piece = {n: statistics.median(v) for n, v in result["component_s"].items()}
    rope_step = statistics.median(result["step_s"]["rope"])
    layers = size.n_layers - size.pe_start_layer
    kernel = "rotation-kernel" if "rotation-kernel" in piece else "rotation-eager"
    f_phi, rotation = (layers * piece[n] / rope_step for n in ("f_phi", kernel))
    rotary = layers * piece["rope-rotary"] / rope_step
    step = (f"f_phi {f_phi:.2%} and the rotation {rotation:.2%} (RoPE's rotary {rotary:.2%}) of the RoPE step, "
            f"RePo layers: {layers} (accounted {result['accounted_step_ratio']['repo']:.4f})")  # fmt: skip
    if profile and profile.own:
        step += f"; the profile's largest RePo-only op: {profile.own[0][0]} ({profile.own[0][2]:.2%})"
    mib = lambda n: n / 2**20  # noqa: E731
    act = result["saved_activation_bytes"]
    memory = (f"saved activations {mib(act['repo'] - act['rope']):+.1f} MiB over RoPE's {mib(act['rope']):.1f} MiB; "
              f"f_phi's weights and gradients {2 * mib(result['f_phi_bytes']):.1f} MiB")  # fmt: skip
    decode_rope = statistics.median(result["decode_s_per_token"]["rope"])
    decode = (f"f_phi and the rotation at one token: {piece['decode'] * 1e6:.0f} us x {layers} RePo layers = "
              f"{layers * piece['decode'] / decode_rope:.2%} of RoPE's {decode_rope * 1e3:.2f} ms per token")  # fmt: skip
    return {"step": step, "memory": memory, "decode": decode}


def profile(size_name: str, device: str, seed: int = 0) -> Profile:
    """`measure.profile_difference` of one training step of the RoPE and the RePo model at `size_name`."""
    size = SIZES[size_name]
    amp = torch.bfloat16 if device == "cuda" else None
    ids = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=device)

    def step_of(mode: str) -> Callable[[], None]:
        torch.manual_seed(seed)
        model = build_model(model_config(size, mode, device)).train()
        return lambda: train_step(model, ids, amp)

    return profile_difference(step_of, device)


def report(result: dict) -> str:
    lines = [
        f"size={result['size']} batch={result['shape']['batch']}x{result['shape']['seq']} device={result['device']} "
        f"threads={result['threads']} torch={result['torch']} "
        + (f"kernels=triton {result['kernels']}" if result["kernels"] else "kernels=off (the torch code)"),
        f"{'variant':<16}{'step (median, ±half-range)':>32}{'peak step memory':>20}{'saved activations':>20}"
        f"{'decode / token':>30}",
    ]
    for name in result["step_s"]:
        lines.append(
            f"{name:<16}{spread(result['step_s'][name]):>32}"
            f"{result['peak_step_memory_bytes'][name] / 2**20:>16.1f} MiB"
            f"{result['saved_activation_bytes'][name] / 2**20:>16.1f} MiB"
            f"{spread(result['decode_s_per_token'][name]):>30}"
        )
    rope_step = statistics.median(result["step_s"]["rope"])
    lines.append(
        "pieces a RePo layer adds or replaces, forward+backward (decode: one token, no autograd), timed alone "
        "(median, share of RoPE step):"
    )
    for name, values in result["component_s"].items():
        lines.append(f"  {name:<20}{spread(values):>28}{statistics.median(values) / rope_step * 100:>8.2f}%")
    for name, r in result["ratios_vs_rope"].items():
        if name != "rope":
            low, high = r["step_ci95"]
            accounted = result["accounted_step_ratio"].get(name)
            lines.append(
                f"{name}/rope: step={r['step']:.3f} (95% CI {low:.3f}-{high:.3f}"
                + (f", accounted {accounted:.3f}" if accounted else "")
                + f") memory={r['memory']:.3f} activations={r['activations']:.3f} decode={r['decode']:.3f}"
            )
    return "\n".join(lines)


def side_by_side(results: list[dict]) -> str:
    """One row per size (multi-head and grouped-query shapes of one run): RePo/RoPE step, memory and decode."""
    lines = [
        "side by side, RePo/RoPE (step: median of within-round ratios, 95% CI; accounted: from the pieces):",
        f"  {'size':<10}{'step (95% CI)':>24}{'accounted':>11}{'memory':>8}{'decode':>8}",
    ]
    for result in results:
        r = result["ratios_vs_rope"]["repo"]
        low, high = r["step_ci95"]
        lines.append(
            f"  {result['size']:<10}{r['step']:>9.3f} ({low:.3f}-{high:.3f}){result['accounted_step_ratio']['repo']:>11.3f}"
            f"{r['memory']:>8.3f}{r['decode']:>8.3f}"
        )
    return "\n".join(lines)


def summary(result: dict, named: bool) -> str:
    """The last line(s): `RePo/RoPE step=... memory=... decode=...`, with ` [size]` when a run has several."""
    r = result["ratios_vs_rope"]["repo"]
    line = f"RePo/RoPE step={r['step']:.3f} memory={r['memory']:.3f} decode={r['decode']:.3f}"
    return line + (f" [{result['size']}]" if named else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        default="cpu",
        help=f"model and batch shape, or several separated by commas, run one after the other in this process "
        f"and compared side by side (e.g. cpu,cpu-gqa); one of {', '.join(sorted(SIZES))} (default: cpu)",
    )
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default: per size)")
    parser.add_argument(
        "--batch",
        type=micro_batch,
        default=None,
        help="micro-batch, in sequences of the size's length (default: the size's; at 2 the 1B's timed rounds fit "
        "an 80 GB H100)",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda if present)",
    )
    parser.add_argument(
        "--json",
        type=json_file,
        default=None,
        help="also write all measurements to this JSON file ({size: measurements})",
    )
    parser.add_argument(
        "--profile", action="store_true", help="first print the per-op time RePo adds over RoPE in one step"
    )
    args = parser.parse_args()
    sizes = args.size.split(",")
    if unknown := [s for s in sizes if s not in SIZES]:
        parser.error(f"--size: unknown {', '.join(unknown)}; choose from {', '.join(sorted(SIZES))}")
    if args.batch is not None:
        SIZES.update({s: dataclasses.replace(SIZES[s], batch=args.batch) for s in sizes})
    results = []
    for size in sizes:
        profiled = profile(size, args.device) if args.profile else None
        if profiled:
            print(profiled.text)
        results.append(run(size, args.reps, args.device))
        results[-1]["held_by"] = held_by(results[-1], profiled)
        print(report(results[-1]))
        print(target_report(results[-1], profiled))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({r["size"]: r for r in results}, f, indent=2)
    if len(results) > 1:
        print(side_by_side(results))
    for result in results:
        print(summary(result, named=len(results) > 1))


if __name__ == "__main__":
    main()
