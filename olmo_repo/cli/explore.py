"""`scripts/explore.py`: the position explorer (`olmo_repo.explore.serve`), served or exported."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoint import as_hf_dir
from . import add_positions_argument, command, run, user_errors

__all__ = ["main"]

PROG = "explore.py"


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Position explorer: a local web page (and JSON API) showing the position every token of a "
        "prompt gets in each RePo layer and head, for one model or two side by side, with each layer's span "
        "and constant/monotonic/hybrid shares. Serves on 127.0.0.1 until Ctrl-C; needs no network.",
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="an HF directory or an OLMo checkpoint directory (config.yaml + model.pt; converted on the fly)",
    )
    parser.add_argument(
        "model2",
        metavar="MODEL2",
        nargs="?",
        default=None,
        help="a second model shown beside the first (e.g. its RoPE baseline, or another step)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one, printed)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=512,
        help="longest prompt in tokens; longer prompts are truncated, with a note (default: 512)",
    )
    parser.add_argument(
        "--device", default=None, help="torch device for the models (default: cuda if available, else cpu)"
    )
    add_positions_argument(parser)
    parser.add_argument(
        "--export",
        nargs=2,
        metavar=("PROMPT_TXT", "OUT_HTML"),
        default=None,
        help="instead of serving: write the page for the prompt in PROMPT_TXT as one "
        "self-contained HTML file OUT_HTML (plotly.js and the data inline; the file's final newline is dropped)",
    )
    parser.add_argument("--force", action="store_true", help="with --export: replace OUT_HTML if it exists")
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
    models = [m for m in (args.model, args.model2) if m]
    options = dict(
        device=args.device, max_tokens=args.max_tokens, open_model=as_hf_dir, positions=args.positions
    )

    def explore() -> None:
        from ..explore.serve import export_page, serve_explorer

        if args.export:
            prompt, out = map(Path, args.export)
            print(f"wrote {export_page(models, prompt, out, force=args.force, **options)}")
        else:
            serve_explorer(models, port=args.port, **options)

    # RuntimeError: torch's, for weights that do not fit the model's config
    return run(PROG, explore, lambda: (*user_errors(), RuntimeError), needs=("explore",))
