"""`scripts/plot_positions.py`: the positions one RePo head predicts for a text, as a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..integrity import require_model_dir
from ..output import PNG_SIGNATURE, check_replaceable_file
from . import add_positions_argument, command, run

__all__ = ["main"]

PROG = "plot_positions.py"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot the positions one RePo head of a model predicts for a text against the token index, "
        "with each token as a label (PNG). With grouped-query attention the heads are the key/value heads (one "
        "position each, shared by their query heads).",
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a Hugging Face directory of a RePo model (repo_olmo2, repo_olmo3, repo_llama, repo_qwen3) or an "
        "unsharded OLMo checkpoint directory of this project (config.yaml + model.pt; converted on the fly)",
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
    parser.add_argument(
        "--head", type=int, default=0, help="key/value head of that layer, 0-indexed (default: 0)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="plot the first N tokens of the text (default: 256)"
    )
    add_positions_argument(parser)
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


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run(PROG, lambda: _plot(args), needs=("eval",))


def _plot(args: argparse.Namespace) -> None:
    if args.out.suffix.lower() != ".png":
        raise ValueError(f"--out {args.out}: the plot is a PNG; name the file *.png")
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1; got {args.max_tokens}")
    text = args.text if args.text is not None else _read_text(args.text_file)
    if not text:
        raise ValueError("the text is empty")
    # the output, then the model (missing or damaged): said before torch loads
    check_replaceable_file(args.out, args.force, PNG_SIGNATURE, "PNG")
    require_model_dir(args.model, tokenizer=True)
    from ..checkpoint import as_hf_dir
    from ..eval.analysis import plot_head_positions  # heavy: once the arguments are valid

    out = plot_head_positions(
        args.model,
        text,
        args.out,
        layer=args.layer,
        head=args.head,
        max_tokens=args.max_tokens,
        device=args.device,
        force=args.force,
        open_model=as_hf_dir,
        positions=args.positions,
    )
    print(f"wrote {out}")


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"--text-file {path} does not exist")
    return path.read_text(encoding="utf-8")
