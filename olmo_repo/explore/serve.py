"""What `scripts/explore.py` does: `serve_explorer` (the page on 127.0.0.1 until Ctrl-C) and `export_page` (one
self-contained HTML file). Both check everything a user's input can get wrong (the models' files, the prompt,
the output, the port) before a model loads or anything is written. Light at import: the `explore` extra,
torch and transformers are imported only once the models' files passed."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import RepoError, install, missing_extra
from ..integrity import ModelOpener, hf_dir_as_is, require_model_dir
from ..modes import PositionSource
from ..output import check_replaceable_file

__all__ = ["PAGE_SIGNATURE", "export_page", "read_prompt", "serve_explorer"]

PAGE_SIGNATURE = (Path(__file__).with_name("page") / "index.html").read_bytes().split(b"</title>")[0]
"""What an exported page starts with (the template's head up to its title): `force` replaces only such a file."""


def read_prompt(path: Path) -> str:
    """The prompt in the UTF-8 file `path`, without an editor's final newline; ValueError when it is empty."""
    prompt = path.read_text(encoding="utf-8").removesuffix("\n")
    if not prompt.strip():
        raise ValueError(f"{path} is empty; write the prompt into it")
    return prompt


def _explore_extra() -> tuple[ModuleType, ModuleType]:
    """The app and model modules, which need the `explore` extra (and import torch: seconds)."""
    try:
        from . import app, model
    except ImportError as e:
        line = missing_extra(e) or f"needs the explore extra ({e.name} is missing): {install('explore')}"
        raise RepoError(f"the explorer {line}") from None
    return app, model


def _load_models(
    models: Sequence[str], device: str | None, max_tokens: int, open_model: ModelOpener, positions: str
) -> list[Any]:
    """The models as `ExplorerModel`s (on cuda when available, unless `device`); ValueError if none has a RePo
    layer, for there is nothing to show then."""
    import torch

    _, model = _explore_extra()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = []
    for path in models:
        print(f"loading {path} ...", file=sys.stderr)
        options = dict(device=device, max_tokens=max_tokens, open_model=open_model, positions=positions)
        loaded.append(model.ExplorerModel(path, **options))
    if not any(m.repo_layers for m in loaded):
        raise ValueError(f"{' and '.join(m.name for m in loaded)}: no RePo layer, so no positions to show")
    return loaded


def export_page(
    models: Sequence[str],
    prompt_file: Path,
    out: Path,
    *,
    force: bool = False,
    device: str | None = None,
    max_tokens: int = 512,
    open_model: ModelOpener = hf_dir_as_is,
    positions: str = PositionSource.learned,
) -> Path:
    """Write the explorer's page for the prompt in `prompt_file` and one or two `models` (HF directories, opened
    by `open_model`: `scripts/explore.py` passes `olmo_repo.checkpoint.as_hf_dir`, which takes ai2-olmo checkpoints
    too) as one self-contained HTML file `out`; an existing `out` is replaced only with `force` and
    only if it is such a page. `positions`: what the RePo layers rotate by (learned; index or constant replace
    the learned positions, as `scripts/eval.py --positions`). Returns `out`."""
    for path in models:
        require_model_dir(path, tokenizer=True)  # before torch loads
    app, _ = _explore_extra()
    prompt = read_prompt(prompt_file)
    check_replaceable_file(out, force, PAGE_SIGNATURE, "position explorer page")
    return app.export_html(_load_models(models, device, max_tokens, open_model, positions), prompt, out)


def serve_explorer(
    models: Sequence[str],
    *,
    port: int = 0,
    device: str | None = None,
    max_tokens: int = 512,
    open_model: ModelOpener = hf_dir_as_is,
    positions: str = PositionSource.learned,
) -> None:
    """Serve the explorer for one or two `models` on 127.0.0.1:`port` (0: a free one), printing its URL, until
    Ctrl-C, which stops it gracefully (and returns). `open_model` and `positions` as for `export_page`."""
    for path in models:
        require_model_dir(path, tokenizer=True)  # before torch loads
    app, _ = _explore_extra()
    try:
        sock = app.listen(port)
    except OSError as e:
        raise OSError(f"cannot listen on 127.0.0.1:{port}: {e.strerror}; pass another --port") from e
    loaded = _load_models(models, device, max_tokens, open_model, positions)
    host, bound = sock.getsockname()
    print(f"position explorer on http://{host}:{bound}/ (Ctrl-C to stop)", flush=True)
    try:
        app.serve(app.create_app(loaded), sock)
    except KeyboardInterrupt:  # uvicorn stops gracefully, then re-raises Ctrl-C: the server's normal end
        pass
