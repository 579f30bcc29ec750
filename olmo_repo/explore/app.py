"""The explorer's web app (FastAPI, served by uvicorn on 127.0.0.1) and its static export.

Routes: `/` the page, `/static/plotly.min.js` (from the installed `plotly` package: no network needed) and
`/static/explorer.js`, `GET /api/models`, `POST /api/positions` and `POST /api/tokens` (the tokens of a
model without RePo layers, whose positions the page draws as RoPE's integer ones). A bad request gets a 4xx
with {"error": one line}.
"""

from __future__ import annotations

import re
import socket
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from plotly.offline import get_plotlyjs
from pydantic import BaseModel, ConfigDict

from ..output import write_file
from .model import BadRequest, ExplorerModel

__all__ = ["PositionsRequest", "TokensRequest", "create_app", "export_html", "listen", "render_page", "serve"]

PAGE = Path(__file__).with_name("page")
_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(PAGE), autoescape=True, undefined=jinja2.StrictUndefined
)


class TokensRequest(BaseModel):
    """The body of `POST /api/tokens` (JSON types are checked strictly; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str
    model: int = 0
    max_tokens: int | None = None


class PositionsRequest(TokensRequest):
    """The body of `POST /api/positions`: no layer or head means all of them."""

    layer: int | None = None
    head: int | None = None


@cache
def _plotly_js() -> str:
    return get_plotlyjs()


def render_page(
    models: list[dict[str, Any]], prompt: str | None = None, results: list[dict[str, Any]] | None = None
) -> str:
    """The page for `models` (`ExplorerModel.info()`s). With `prompt` and `results` (one `positions` or
    `tokens` answer per model) it is the static export: plotly.js, the script and the data inline."""
    config = dict(models=models, prompt=prompt, results=results)
    scripts = None
    if results is not None:  # "</script" would end an inline script early; in JS strings "<\/" means "</"
        scripts = [
            re.sub("</(script)", r"<\\/\1", js, flags=re.IGNORECASE)
            for js in (_plotly_js(), (PAGE / "explorer.js").read_text())
        ]
    return _TEMPLATES.get_template("index.html").render(config=config, inline_scripts=scripts)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(models: list[ExplorerModel]) -> FastAPI:
    """The explorer's app over loaded models (index = position in `models`)."""
    # No /docs: FastAPI's documentation pages load their scripts from a CDN.
    app = FastAPI(title="RePo position explorer", docs_url=None, redoc_url=None, openapi_url=None)
    page = render_page([m.info() for m in models])

    @app.exception_handler(RequestValidationError)
    def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # loc: ("body", field) for a bad field, ("body", offset) for JSON that does not parse
        fields = [".".join(p for p in e["loc"][1:] if isinstance(p, str)) or "body" for e in exc.errors()]
        problems = [f"{field}: {e['msg']}" for field, e in zip(fields, exc.errors())]
        return _error(422, "; ".join(problems))

    @app.exception_handler(BadRequest)
    def bad_request(_request: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc))

    def pick(request: TokensRequest) -> ExplorerModel:
        if not 0 <= request.model < len(models):
            raise BadRequest(f"model {request.model} is out of range: allowed 0..{len(models) - 1}")
        return models[request.model]

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/static/plotly.min.js")
    def plotly_js() -> Response:
        return Response(_plotly_js(), media_type="text/javascript")

    @app.get("/static/explorer.js")
    def explorer_js() -> Response:
        return Response((PAGE / "explorer.js").read_text(), media_type="text/javascript")

    @app.get("/api/models")
    def list_models() -> list[dict[str, Any]]:
        return [m.info() for m in models]

    # Plain `def`s run in FastAPI's thread pool; each model serves one request at a time (its lock).
    # JSONResponse: json.dumps writes every fp32 value exactly (its shortest repr as a double).
    @app.post("/api/positions")
    def positions(request: PositionsRequest) -> JSONResponse:
        model = pick(request)
        return JSONResponse(model.positions(request.prompt, request.layer, request.head, request.max_tokens))

    @app.post("/api/tokens")
    def tokens(request: TokensRequest) -> JSONResponse:
        return JSONResponse(pick(request).tokens(request.prompt, request.max_tokens))

    return app


def listen(port: int = 0) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` (0: a free port). Raises OSError if the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()  # holds the port while the models load; connections wait in the backlog
    return sock


def serve(app: FastAPI, sock: socket.socket) -> None:
    """Serve `app` on `sock` (from `listen`) until interrupted (Ctrl-C, SIGTERM)."""
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def export_html(models: list[ExplorerModel], prompt: str, out: Path) -> Path:
    """Write the page for `prompt` as one self-contained HTML file (whole or not at all: `write_file`)."""
    results = [m.positions(prompt) if m.repo_layers else m.tokens(prompt) for m in models]
    return write_file(out, render_page([m.info() for m in models], prompt, results))
