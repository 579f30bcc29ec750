"""Position explorer: the JSON API against `predict_positions`, bad requests, the static export, the command line,
and the page in a real browser (Debian's chromium driven by Playwright) served by `scripts/explore.py`.

Tiny checkpoints: `repo` (OLMo format, RePo layers 1-3), `hybrid` (converted to HF, RePo layers 0 and 2) and
`rope` (OLMo format, no RePo layer, as a RoPE baseline).
"""

from __future__ import annotations

import json
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import uvicorn
from plotly.offline import get_plotlyjs
from tokenizers import Tokenizer

from olmo_repo import predict_positions
from olmo_repo.ai2olmo.hf import convert_to_hf
from olmo_repo.checkpoint import as_hf_dir
from olmo_repo.cli.explore import main
from olmo_repo.eval.positions import position_patterns, position_spans
from olmo_repo.explore.app import create_app, listen
from olmo_repo.explore.model import MAX_PROMPT_CHARS, BadRequest, ExplorerModel
from olmo_repo.positions import spread

from .conftest import ROOT, make_checkpoint

PROMPT = "RePo moves tokens: the cat sat on the mat, <b>then</b> slept."
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    *("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"),
    *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, tokenizer_file) -> SimpleNamespace:
    tmp = tmp_path_factory.mktemp("explore")
    torch.manual_seed(0)
    repo, repo_olmo = make_checkpoint(tmp / "repo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    hybrid, hybrid_olmo = make_checkpoint(tmp / "hybrid", tokenizer_file, pe_mode="repo", pe_layer_ids=[0, 2])
    rope, _ = make_checkpoint(tmp / "rope", tokenizer_file)
    gqa, gqa_olmo = make_checkpoint(
        tmp / "gqa", tokenizer_file, pe_mode="repo", pe_start_layer=1, n_kv_heads=2
    )
    return SimpleNamespace(
        gqa=gqa,
        gqa_olmo=gqa_olmo,
        tmp=tmp,
        repo=repo,
        repo_olmo=repo_olmo,
        hybrid_hf=convert_to_hf(hybrid, tmp / "hybrid-hf"),
        hybrid_olmo=hybrid_olmo,
        rope=rope,
        tokenizer=Tokenizer.from_file(str(tokenizer_file)),
    )


@contextmanager
def running(models: list[ExplorerModel]) -> Iterator[str]:
    """The explorer's app on a real uvicorn server (127.0.0.1, a free port) in a thread; yields its URL."""
    sock = listen()
    server = uvicorn.Server(uvicorn.Config(create_app(models), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def post(url: str, body: object) -> tuple[int, dict]:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def tags(html: str) -> list[tuple[str, dict]]:
    """The HTML's start tags and attributes (what the browser parses; script contents are not tags)."""
    found = []
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: found.append((tag, dict(attrs)))
    parser.feed(html)
    return found


def loads_nothing_remote(html: str) -> bool:
    return not any(re.match(r"(https?:)?//", v or "") for _, attrs in tags(html) for v in attrs.values())


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def assert_close_to_olmo(got: torch.Tensor, expected: torch.Tensor) -> None:
    """HF and OLMo compute the same fp32 ops in different code: a bound from fp32's epsilon and the size."""
    diff = (got - expected).abs().max().item()
    bound = 100 * torch.finfo(torch.float32).eps * expected.abs().max().item()
    print(f"max |API - predict_positions| {diff:.3g} (bound {bound:.3g})")
    assert diff <= bound


# ------------------------------------------------------------------------------------------------- API


def test_a_grouped_query_model_shows_one_position_per_key_value_head(ckpts):
    """GQA (4 query heads, 2 key/value heads): the explorer's heads are the key/value heads, and it says so."""
    model = ExplorerModel(ckpts.gqa, open_model=as_hf_dir)
    assert model.info()["n_heads"] == 2 and model.info()["n_query_heads"] == 4
    ids = ckpts.tokenizer.encode(PROMPT).ids
    out = model.positions(PROMPT)
    assert out["layers"] == [1, 2, 3] and out["heads"] == [0, 1]
    got = torch.tensor(out["positions"], dtype=torch.float32)  # [L, H_kv, T]
    assert got.shape == (3, 2, len(ids))
    with torch.no_grad():
        olmo = predict_positions(ckpts.gqa_olmo, torch.tensor([ids]))
    for i, layer in enumerate(out["layers"]):
        assert_close_to_olmo(got[i], olmo[layer][0])
    with pytest.raises(BadRequest, match="has heads 0..1"):
        model.positions(PROMPT, head=2)


def test_api_returns_the_positions_the_models_compute(ckpts):
    models = [ExplorerModel(ckpts.repo, open_model=as_hf_dir), ExplorerModel(ckpts.hybrid_hf)]
    with running(models) as url:
        status, out = post(url + "api/positions", {"prompt": PROMPT})
        assert status == 200
        ids = ckpts.tokenizer.encode(PROMPT).ids
        assert out["token_ids"] == ids and "".join(out["tokens"]) == PROMPT
        assert out["prompt_tokens"] == len(ids) and out["truncated"] is False
        assert out["layers"] == [1, 2, 3] and out["heads"] == [0, 1, 2, 3]
        got = torch.tensor(out["positions"], dtype=torch.float32)  # [L, H, T]
        assert got.shape == (3, 4, len(ids))
        with torch.no_grad():
            hf = models[0].model(torch.tensor([ids]), output_positions=True).positions
            olmo = predict_positions(ckpts.repo_olmo, torch.tensor([ids]))
        for i, layer in enumerate(out["layers"]):
            assert torch.equal(got[i], hf[layer][0])  # the fp32 values the model computed, exactly
            assert_close_to_olmo(got[i], olmo[layer][0])
            assert out["spans"][i] == position_spans(got[i]).tolist()
            assert out["patterns"][i]["all"] == position_patterns(got[i], 16, 0.2)
            assert out["patterns"][i]["heads"] == [position_patterns(z, 16, 0.2) for z in got[i]]
            assert out["spread"][i] == spread(
                got[i]
            )  # std, percentiles, rank correlation: the trainers' stats

        # One layer and head of the second model (an HF directory); a prompt truncated to max_tokens.
        status, out = post(
            url + "api/positions", {"prompt": PROMPT, "model": 1, "layer": 2, "head": 3, "max_tokens": 9}
        )
        assert status == 200 and out["layers"] == [2] and out["heads"] == [3]
        assert out["token_ids"] == ids[:9] and out["truncated"] is True and out["prompt_tokens"] == len(ids)
        with torch.no_grad():
            expected = predict_positions(ckpts.hybrid_olmo, torch.tensor([ids[:9]]))[2][0, 3:4]
        assert_close_to_olmo(torch.tensor(out["positions"][0]), expected)

        # Concurrent requests are served (one at a time per model) and agree.
        body = {"prompt": PROMPT, "layer": 3}
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post(url + "api/positions", body), range(4)))
        assert all(a == answers[0] for a in answers) and answers[0][0] == 200


def test_replaced_positions_show_what_the_layers_rotate_by(ckpts):
    """`--positions index|constant`, as an evaluation replaces the learned positions: the explorer says so and shows
    the token index, or one position for every token; a model without RePo layers is refused in one line."""
    n = len(ckpts.tokenizer.encode(PROMPT).ids)
    index = torch.arange(float(n)).expand(2, 4, n)  # [L, H, T]: layers 0 and 2
    for source, expected in {"index": index, "constant": torch.zeros(2, 4, n)}.items():
        model = ExplorerModel(ckpts.hybrid_hf, positions=source)
        assert model.info()["positions"] == source
        out = model.positions(PROMPT)
        assert out["layers"] == [0, 2] and torch.equal(torch.tensor(out["positions"]), expected), source
        order = pytest.approx(
            1.0 if source == "index" else 0.0, abs=n * torch.finfo(torch.float32).eps
        )  # fp32 sums
        assert [s["rank_corr"] for s in out["spread"]] == [order] * 2
    assert ExplorerModel(ckpts.hybrid_hf).info()["positions"] == "learned"
    with pytest.raises(
        ValueError, match="pe_positions=index acts on the positions of RePo layers, but this model"
    ):
        ExplorerModel(ckpts.rope, open_model=as_hf_dir, positions="index")


def test_bad_requests_get_a_4xx_with_one_line(ckpts):
    with running(
        [ExplorerModel(ckpts.repo, open_model=as_hf_dir), ExplorerModel(ckpts.rope, open_model=as_hf_dir)]
    ) as url:
        cases = [
            ({"prompt": PROMPT, "layer": 0}, 400, r"layer 0 is not a RePo layer .*RePo layers: 1, 2, 3"),
            ({"prompt": PROMPT, "layer": 7}, 400, r"layer 7 is not a RePo layer"),
            ({"prompt": PROMPT, "head": 4}, 400, r"head 4 is out of range: .* heads 0..3"),
            ({"prompt": PROMPT, "head": -1}, 400, r"head -1 is out of range"),
            ({"prompt": PROMPT, "model": 2}, 400, r"model 2 is out of range: allowed 0..1"),
            ({"prompt": PROMPT, "model": 1}, 400, r"rope has no RePo layer"),
            ({"prompt": ""}, 400, r"prompt is empty"),
            ({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}, 400, rf"{MAX_PROMPT_CHARS + 1} characters; the limit"),
            ({"prompt": PROMPT, "max_tokens": 0}, 400, r"max_tokens=0 is out of range: allowed 1..512"),
            ({"prompt": PROMPT, "max_tokens": 513}, 400, r"max_tokens=513 is out of range"),
            ({}, 422, r"prompt: Field required"),
            ({"prompt": 3}, 422, r"prompt: Input should be a valid string"),
            ({"prompt": PROMPT, "layer": "2"}, 422, r"layer: Input should be a valid integer"),
            ({"prompt": PROMPT, "heads": 1}, 422, r"heads: Extra inputs are not permitted"),
            ("{not json", 422, r"body: JSON decode error"),
        ]
        for body, status, message in cases:
            got_status, out = post(url + "api/positions", body)
            assert (got_status, list(out)) == (status, ["error"]), (body, out)
            assert re.search(message, out["error"]) and "\n" not in out["error"], (body, out)
        # The tokens of a model without RePo layers (the page draws its RoPE positions from them).
        status, out = post(url + "api/tokens", {"prompt": PROMPT, "model": 1, "max_tokens": 4})
        assert (
            status == 200 and out["token_ids"] == ckpts.tokenizer.encode(PROMPT).ids[:4] and out["truncated"]
        )
        assert post(url + "api/tokens", {"prompt": PROMPT, "layer": 1}) == (
            422,
            {"error": "layer: Extra inputs are not permitted"},
        )
        models = json.loads(get(url + "api/models"))
        assert [m["repo_layers"] for m in models] == [[1, 2, 3], []]
        assert models[1]["layer_modes"] == ["rope"] * 4
        # Everything the page loads comes from this server (no network).
        page = get(url).decode()
        scripts = [attrs.get("src") for tag, attrs in tags(page) if tag == "script"]
        assert scripts == [None, "static/plotly.min.js", "static/explorer.js"]  # None: the JSON config
        assert loads_nothing_remote(page)
        assert get(url + "static/plotly.min.js").decode() == get_plotlyjs()
        assert b"Plotly.react" in get(url + "static/explorer.js")


# ---------------------------------------------------------------------------------------------- export


def exported_config(html: str) -> dict:
    return json.loads(
        re.search(r'<script id="explorer-config" type="application/json">(.*?)</script>', html, re.S)[1]
    )


@pytest.mark.slow
def test_export_writes_one_self_contained_file(ckpts, tmp_path, capsys):
    prompt, out = tmp_path / "prompt.txt", tmp_path / "out" / "page.html"
    prompt.write_text(PROMPT + "\n")
    assert main([str(ckpts.repo), str(ckpts.rope), "--export", str(prompt), str(out)]) == 0
    html = out.read_text()
    print(f"export: {len(html) / 1e6:.2f} MB")
    scripts = [attrs for tag, attrs in tags(html) if tag == "script"]
    assert len(scripts) == 3 and not any("src" in attrs for attrs in scripts) and loads_nothing_remote(html)
    assert get_plotlyjs() in html  # it has no "</script" to escape
    config = exported_config(html)
    assert config["prompt"] == PROMPT and [m["repo_layers"] for m in config["models"]] == [[1, 2, 3], []]
    positions, tokens = config["results"]
    assert positions == ExplorerModel(ckpts.repo, open_model=as_hf_dir).positions(PROMPT)
    assert tokens["token_ids"] == ckpts.tokenizer.encode(PROMPT).ids and "positions" not in tokens

    # The user's files are kept: an existing output without --force, nothing written on bad input.
    out.write_text("mine")
    assert main([str(ckpts.repo), "--export", str(prompt), str(out)]) == 1
    assert out.read_text() == "mine" and "exists; pass --force" in capsys.readouterr().err
    assert main([str(ckpts.repo), "--export", str(prompt), str(out), "--force"]) == 1  # not a page it wrote
    assert out.read_text() == "mine" and "not a position explorer page" in capsys.readouterr().err
    out.write_text(html)
    assert main([str(ckpts.repo), "--export", str(prompt), str(out), "--force"]) == 0
    assert exported_config(out.read_text())["results"][0] == positions
    (tmp_path / "empty.txt").write_text(" \n")
    for argv, message in [
        (
            [str(ckpts.repo), "--export", str(tmp_path / "empty.txt"), str(tmp_path / "a.html")],
            "empty.txt is empty",
        ),
        ([str(ckpts.repo), "--export", str(tmp_path / "none.txt"), str(tmp_path / "a.html")], "none.txt"),
        (
            [str(tmp_path / "nowhere"), "--export", str(prompt), str(tmp_path / "a.html")],
            "nowhere: not a model",
        ),
        ([str(ckpts.rope), "--export", str(prompt), str(tmp_path / "a.html")], "no RePo layer"),
    ]:
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in err if line.startswith("explore.py: error:")]
        assert len(errors) == 1 and message in err[-1], err
    assert (
        sorted(p.name for p in (tmp_path / "out").iterdir()) == ["page.html"]
        and not (tmp_path / "a.html").exists()
    )


def test_command_line(ckpts, capsys):
    with listen() as taken:
        assert main([str(ckpts.repo), "--port", str(taken.getsockname()[1])]) == 1
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- browser


@contextmanager
def explore_server(*models: Path) -> Iterator[str]:
    """`scripts/explore.py MODEL [MODEL2]` as a subprocess; yields the URL it prints, then stops it."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "explore.py"), *map(str, models)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            line = proc.stdout.readline() if sel.select(timeout=120) else ""
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert match, f"no URL printed: {line!r}"
        yield match[0]
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully on SIGTERM, then lets the signal end the process.
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in stderr, stderr[-2000:]


def plot_traces(page) -> list[dict]:
    return page.evaluate(
        """() => {
            const plot = document.getElementById("plot");
            const drawn = [...plot.querySelectorAll(".scatterlayer .trace")].map((t) => t.querySelectorAll(".points path").length);
            return plot.data.map((t, i) => ({meta: t.meta, x: t.x, y: t.y, text: t.text, drawn: drawn[i]}));
        }"""
    )


@pytest.mark.slow
def test_page_in_a_real_browser(ckpts, tmp_path):
    """Type a prompt, switch layer and head: the plot has one point per token, at the API's positions."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (make test installs it with apt-get where it can)")
    from playwright.sync_api import sync_playwright

    prompt = PROMPT * 2  # longer than max tokens: truncated, with a note
    with explore_server(ckpts.repo, ckpts.hybrid_hf) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        outside, errors = [], []
        # Only this server (and the exported file below) may be reached: the page must work offline.
        browser.route(
            re.compile(r"^(?!" + re.escape(url) + r"|file://)"),
            lambda route: (outside.append(route.request.url), route.abort()),
        )
        page = browser.new_page()
        page.set_default_timeout(20_000)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(url)
        assert page.locator("#layer option").all_inner_texts() == [
            "layer 0 (RePo in model 1 only)",
            "layer 1 (RePo in model 0 only)",
            "layer 2",
            "layer 3 (RePo in model 0 only)",
        ]
        page.fill("#prompt", prompt)
        page.fill("#max-tokens", "40")
        page.click("#run")
        page.wait_for_function("document.getElementById('plot').data?.length > 0")
        page.select_option("#layer", "2")
        page.select_option("#head", "1")

        api = [
            post(url + "api/positions", {"prompt": prompt, "model": m, "max_tokens": 40})[1] for m in (0, 1)
        ]
        assert api[0]["token_ids"] == ckpts.tokenizer.encode(prompt).ids[:40]
        traces = plot_traces(page)
        assert [t["meta"] for t in traces] == [{"model": m, "layer": 2, "head": 1} for m in (0, 1)]
        for t, out in zip(traces, api):
            i = out["layers"].index(2)
            assert t["x"] == list(range(40)) and t["drawn"] == 40  # one point per token, drawn
            assert t["y"] == out["positions"][i][1]  # the API's fp32 values, exactly
            assert len(t["text"]) == 40 and t["text"][5] == out["tokens"][5]
        stats = page.inner_text("#stats")
        assert f"{api[0]['spans'][1][1]:.3f}" in stats and f"{api[1]['spans'][1][1]:.3f}" in stats
        notes = page.inner_text("#notes")
        assert f"the prompt has {api[0]['prompt_tokens']} tokens; only the first 40 are shown" in notes
        assert "220" in page.inner_text("#tokens")  # the token ids (byte-level: 220 is a space)

        # Layer 0 is RePo in model 1 only: its 4 heads, and model 0's RoPE positions (the token indices).
        page.select_option("#layer", "0")
        page.select_option("#head", "all")
        traces = plot_traces(page)
        assert [t["meta"] for t in traces] == [{"model": 0, "layer": 0, "head": None}] + [
            {"model": 1, "layer": 0, "head": h} for h in range(4)
        ]
        assert traces[0]["y"] == list(range(40)) and all(t["drawn"] == 40 for t in traces)
        assert [t["y"] for t in traces[1:]] == api[1]["positions"][api[1]["layers"].index(0)]

        # The static export, opened from disk, shows the same plot.
        (tmp_path / "prompt.txt").write_text(prompt)
        export = tmp_path / "page.html"
        assert (
            main(
                [
                    str(ckpts.repo),
                    str(ckpts.hybrid_hf),
                    "--max-tokens",
                    "40",
                    "--export",
                    str(tmp_path / "prompt.txt"),
                    str(export),
                ]
            )
            == 0
        )
        page.goto(export.as_uri())
        page.select_option("#layer", "2")
        page.select_option("#head", "1")
        assert [t["y"] for t in plot_traces(page)] == [
            out["positions"][out["layers"].index(2)][1] for out in api
        ]
        assert page.is_hidden("#run") and "only the first 40" in page.inner_text("#notes")
        browser.close()
    assert outside == [] and errors == []


def test_the_explorer_library_opens_hf_directories_and_leaves_trainer_checkpoints_to_the_command(ckpts):
    """The explorer imports no trainer: by default it takes an HF directory as it is, and refuses an ai2-olmo
    checkpoint in one line naming the opener that converts it (what scripts/explore.py passes)."""
    with pytest.raises(
        FileNotFoundError, match=r"rope: not a Hugging Face directory .*olmo_repo\.checkpoint\.as_hf_dir"
    ):
        ExplorerModel(ckpts.rope)
    assert ExplorerModel(ckpts.hybrid_hf).repo_layers == [0, 2]
