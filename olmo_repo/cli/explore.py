"""Command line of `scripts/explore.py` (the script only calls `main`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import RepoError
from ..integrity import require_model_dir
from ..output import check_replaceable_file

__all__ = ["main"]

# What an exported page starts with (the template's head up to its title): --force replaces only such a file.
_PAGE = Path(__file__).resolve().parents[1] / "explore" / "page" / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="explore.py",
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
    try:  # the models' files, before torch loads (seconds)
        for path in filter(None, (args.model, args.model2)):
            require_model_dir(path)
    except (OSError, RepoError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:  # the `explore` extra
        from ..explore.app import create_app, export_html, listen, serve
        from ..explore.model import ExplorerModel
    except ImportError as e:
        print(
            f"error: the explorer needs the `explore` extra ({e.name} is missing): pip install -e '.[explore]'",
            file=sys.stderr,
        )
        return 1
    import torch
    from huggingface_hub.errors import StrictDataclassError

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:  # everything that can fail on the user's input, before the models load or anything is written
        if args.export:
            prompt_file, out = Path(args.export[0]), Path(args.export[1])
            prompt = prompt_file.read_text(encoding="utf-8").removesuffix("\n")  # an editor's final newline
            if not prompt.strip():
                raise ValueError(f"{prompt_file} is empty; write the prompt into it")
            signature = _PAGE.read_bytes().split(b"</title>")[0]
            check_replaceable_file(out, args.force, signature, "position explorer page")
        else:
            try:
                sock = listen(args.port)
            except OSError as e:
                raise OSError(
                    f"cannot listen on 127.0.0.1:{args.port}: {e.strerror}; pass another --port"
                ) from e
        models = []
        for path in filter(None, (args.model, args.model2)):
            print(f"loading {path} ...", file=sys.stderr)
            models.append(ExplorerModel(path, device=device, max_tokens=args.max_tokens))
        if not any(m.repo_layers for m in models):
            raise ValueError(
                f"{' and '.join(m.name for m in models)}: no RePo layer, so no positions to show"
            )
        if args.export:
            print(f"wrote {export_html(models, prompt, out)}")
            return 0
    except (OSError, ValueError, KeyError, RuntimeError, StrictDataclassError, RepoError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()
    print(f"position explorer on http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        serve(create_app(models), sock)
    except KeyboardInterrupt:  # uvicorn stops gracefully, then re-raises Ctrl-C
        pass
    return 0
