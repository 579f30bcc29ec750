"""`scripts/plot_positions.py`: the positions one RePo head predicts for a text, as a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..integrity import require_model_dir
from ..output import check_replaceable_file
from . import run

__all__ = ["main"]

PROG = "plot_positions.py"

_PNG = b"\x89PNG\r\n\x1a\n"  # every PNG file starts with it: --force replaces only a PNG


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot the positions one RePo head of a model predicts for a text against the token index, "
        "with each token as a label (PNG).",
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a Hugging Face directory of this project (repo_olmo2) or an unsharded OLMo checkpoint directory of "
        "this project (config.yaml + model.pt; converted on the fly)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to position")
    source.add_argument("--text-file", type=Path, help="a UTF-8 file holding the text to position")
    parser.add_argument(
        "--layer",
        type=int,
        default=None,
        help="RePo layer to plot, 0-indexed (default: the first RePo layer)",
    )
    parser.add_argument("--head", type=int, default=0, help="attention head of that layer (default: 0)")
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="plot the first N tokens of the text (default: 256)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="PNG file to write (must not exist unless --force)"
    )
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument(
        "--device",
        default=None,
        help="torch device to run the model on (default: cuda if available, else cpu)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run(PROG, lambda: _plot(args))


def _plot(args: argparse.Namespace) -> None:
    check_replaceable_file(args.out, args.force, _PNG, "PNG")
    if args.out.suffix.lower() != ".png":
        raise ValueError(f"--out {args.out}: the plot is a PNG; name the file *.png")
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1; got {args.max_tokens}")
    text = args.text if args.text is not None else _read_text(args.text_file)
    if not text:
        raise ValueError("the text is empty")
    require_model_dir(args.model)  # missing, not a model or a damaged file: before torch loads

    # Heavy imports only once the arguments are valid, so that a bad flag fails at once.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import olmo_repo.hf  # noqa: F401  (registers repo_olmo2)

    from ..eval.plots import plot_positions
    from ..eval.positions import text_positions
    from ..hf.convert import as_hf_dir

    with as_hf_dir(args.model) as hf_dir:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(device)
        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    positions, tokens = text_positions(model, tokenizer, text, args.max_tokens)
    layer = min(positions) if args.layer is None else args.layer
    if layer not in positions:
        raise ValueError(
            f"--layer {layer} is not a RePo layer of {args.model}; RePo layers: {sorted(positions)}"
        )
    n_heads = positions[layer].shape[0]
    if not 0 <= args.head < n_heads:
        raise ValueError(
            f"--head {args.head} is out of range: the model has {n_heads} heads (0..{n_heads - 1})"
        )
    z = positions[layer][args.head]  # [T]
    title = f"{Path(args.model).name}: layer {layer}, head {args.head}, {len(tokens)} tokens, span {z.max() - z.min():.2f}"
    out = plot_positions(z, tokens, args.out, title=title)
    print(f"wrote {out}")


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"--text-file {path} does not exist")
    return path.read_text(encoding="utf-8")
