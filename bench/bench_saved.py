"""What a RePo layer keeps for backward beyond a RoPE layer, in bytes per token, under bf16 autocast (the path a GPU
trains on), at the 1B's per-layer widths (d_model 2048, 16 heads of 128; multi-head and 4 key/value heads), on
RePo's kernels and on its torch code, beside issue 59's allowance.

    .venv/bin/python bench/bench_saved.py        # CPU: the kernels under Triton's interpreter (set here)
    python3 bench/bench_saved.py                 # a GPU: the kernels and the attention as they run there

Two models of two layers share their weights: RoPE in both, or RePo in the second. Autograd's saved tensors are
counted once per storage (torch.autograd.graph.saved_tensors_hooks), weights excluded, in one forward at `--tokens`
tokens; RePo's layer keeps the difference. `f_phi` is what the layer saves before its positions come out (the
activation checkpoint's input) and nothing else saves too: the same on every device. The rest of the difference is what the
rotation and the attention keep of q and k, which depends on the attention kernel's own saving (whether it keeps
the rotated q and k the rotation keeps, or copies of them in another layout): device-only, measured here for this
device's attention.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from measure import json_file

ALLOWANCE = 3500
"""Issue 59's allowance, bytes per token per RePo layer beyond RoPE's: positions (16-64 bytes) and f_phi's hidden
state (2,048 in fp32) fit, an fp32 copy of the layer's input (8,192 at the 1B) does not."""
WIDTHS = {"1b": (2048, 16), "tiny": (64, 8)}  # d_model, heads (head size 128 and 8)


def saved(model: torch.nn.Module, ids: torch.Tensor, block: torch.nn.Module) -> tuple[int, int]:
    """(bytes autograd keeps from one forward under bf16 autocast, weights excluded, each storage once; of which
    those saved only in `block` before its positions come out, from its forward's start to its `positions_out`:
    f_phi's own)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    inside, outside = set(), set()  # storages saved before the positions come out, and elsewhere
    counting = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
            (inside if counting[0] else outside).add(storage.data_ptr())
        return t

    hooks = [block.register_forward_pre_hook(lambda *_: counting.__setitem__(0, True))]
    if hasattr(block, "positions_out"):
        hooks.append(block.positions_out.register_forward_hook(lambda *_: counting.__setitem__(0, False)))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast(ids.device.type, dtype=torch.bfloat16):
                model(ids).logits.sum()
    finally:
        for hook in hooks:
            hook.remove()
    f_phi = sum(seen[s] for s in inside - outside) if hasattr(block, "positions_out") else 0
    return sum(seen.values()), f_phi


def measure(width: str, n_kv: int, kernels: str, tokens: int, device: str) -> dict[str, float]:
    """Bytes per token that the RePo layer keeps beyond the RoPE layer: in all, and f_phi's part."""
    from olmo_repo import build_model, olmo2_model_config
    from olmo_repo.rope import set_kernels

    d_model, heads = WIDTHS[width]
    ids = torch.randint(0, 256, (1, tokens), device=device)
    figures = {}
    for mode in ("rope", "repo"):
        torch.manual_seed(0)
        config = olmo2_model_config(
            d_model=d_model, n_heads=heads, n_kv_heads=n_kv, n_layers=2, mlp_ratio=1, vocab_size=256,
            embedding_size=256, max_sequence_length=tokens, init_device=device, pe_mode=mode, pe_start_layer=1,
        )  # fmt: skip
        model = build_model(config).train()
        set_kernels(model, kernels)
        figures[mode] = saved(model, ids, model.transformer.blocks[1])
    (rope, _), (repo, f_phi) = figures["rope"], figures["repo"]
    return {"extra": (repo - rope) / tokens, "f_phi": f_phi / tokens, "rest": (repo - rope - f_phi) / tokens}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", choices=sorted(WIDTHS), default="1b", help="layer widths (default: 1b)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens in the forward (default 64)")
    parser.add_argument(
        "--json", type=json_file, default=None, help="also write the figures to this JSON file"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # the kernels under Triton's interpreter: set before `olmo_repo.kernels` is imported
        os.environ["TRITON_INTERPRET"] = "1"
    heads = WIDTHS[args.width][1]
    print(
        f"saved for backward, RePo layer - RoPE layer, bytes per token (bf16 autocast, {device}, widths {args.width}, "
        f"{args.tokens} tokens; allowance {ALLOWANCE:,}):"
    )
    print(f"  {'path':<9}{'attention':<11}{'RePo - RoPE':>12}{'f_phi':>8}{'q, k, positions*':>18}  allowance")
    results = {}
    for kernels in ("kernels", "torch"):
        for n_kv in (heads, 4):
            name = f"{kernels}, {'MHA' if n_kv == heads else f'GQA {heads}/{n_kv}'}"
            r = results[name] = measure(args.width, n_kv, kernels, args.tokens, device)
            verdict = "within" if r["extra"] <= ALLOWANCE else "OVER"
            print(
                f"  {kernels:<9}{name.split(', ')[1]:<11}{r['extra']:>12,.0f}{r['f_phi']:>8,.0f}{r['rest']:>18,.0f}"
                f"  {verdict}"
            )
    print(
        "  * device-only: what the rotation and the attention keep of q, k and the positions beyond RoPE's depends on "
        "the attention kernel's own saving (here: this device's)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "allowance": ALLOWANCE, "bytes_per_token": results}, f, indent=2)


if __name__ == "__main__":
    main()
