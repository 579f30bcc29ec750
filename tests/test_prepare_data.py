"""`scripts/prepare_data.py` (datatrove in .venv-data, run as a user runs it): the ids are the `tokenizers`
package's with the model's end id after each document, in uint32 shards whatever the vocabulary; jsonl, jsonl.gz,
jsonl.zst and parquet, local or on a real S3-compatible server; two machines' parts joined give the documents of
one; a killed run continues, keeping the finished tasks' shards; a damaged shard is redone; other settings are
refused; a mix writes a folder per source and the fragment both trainers read; bad input is one line with
nothing written. tokenize_text.py's output is unchanged (the SmolLM2 recipe's numbers depend on it)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.experiments.demo.corpus import generate_document

from .dead_terminal import run_to_head
from .prepared_data import (
    DATA_PYTHON,
    ROOT,
    SCRIPT,
    documents,
    needs_data_env,
    prepare_data,
    prepare_each,
    write_corpus,
)

pytestmark = [needs_data_env, pytest.mark.slow]

MIXED = [
    "The code of apple is 123. Question: what is the code of apple? Answer: 123.",
    "def f(x):\n    return x ** 2  # squares\n\nprint(f(12345678901234567890))\n",
    "émoji 😀🚀, 日本語のテキスト, Ελληνικά, русский, עברית, हिन्दी and \u200b zero widths",
    "<|endoftext|> in the middle of a text <|pad|> is its id, as the tokenizer reads it",
    "   leading spaces, \t\ttabs, trailing\n\n\n",
    "x",
]


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(generate_document(rng) for _ in range(rng.randrange(1, 12))) for _ in range(n)]


def _model(tmp_path: Path) -> Path:
    """The demo's model directory with a tokenizer.json that truncates to 16 tokens and adds a start id (as Llama
    3's template does): what the command must undo (no truncation, no template but the end id)."""
    model = tmp_path / "model"
    shutil.copytree(BASE_DIR, model)
    data = json.loads((model / "tokenizer.json").read_text())
    data["truncation"] = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|pad|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|pad|>": {"id": "<|pad|>", "ids": [1], "tokens": ["<|pad|>"]}},
    }
    (model / "tokenizer.json").write_text(json.dumps(data))
    return model


def _expected(texts: list[str]) -> Counter:
    """Each text as the `tokenizers` package encodes it with the demo tokenizer, then the end id (0)."""
    tokenizer = Tokenizer.from_file(str(BASE_DIR / "tokenizer.json"))
    return Counter(tuple(tokenizer.encode(t, add_special_tokens=False).ids) + (0,) for t in texts)


def _corpus(root: Path, texts: list[str]) -> Path:
    """`texts` over four files, one of each format (a record's other fields are kept out of the text)."""
    parts = [texts[i::4] for i in range(4)]
    names = ["a.jsonl", "b/c.jsonl.gz", "b/d.jsonl.zst", "e.parquet"]
    write_corpus({root / n: [{"text": t, "id": i} for i, t in enumerate(p)] for n, p in zip(names, parts)})
    return root


def test_ids_are_the_tokenizers_with_the_end_id_in_uint32_shards(tmp_path):
    long = " ".join(_texts(40, seed=1))  # one document of several windows of 512: kept whole, not cut
    texts = MIXED + _texts(30) + [long]
    corpus = _corpus(tmp_path / "corpus", texts)
    out = tmp_path / "out"
    done = prepare_data(
        "--model",
        str(_model(tmp_path)),
        "--output",
        str(out),
        "--shard-tokens",
        "3000",
        "--workers",
        "1",
        str(corpus),
    )
    assert f"wrote {out}:" in done.stdout
    got = documents(out)
    assert Counter(got) == _expected(texts)
    assert max(len(d) for d in got) > 4 * 512
    data = json.loads((out / "data.json").read_text())
    shards = data["shards"]
    assert len(shards) > 4 and all(s["tokens"] <= 3000 + max(map(len, got)) for s in shards)
    assert all((out / s["path"]).stat().st_size == 4 * s["tokens"] for s in shards)  # uint32: 4 bytes an id
    assert (data["dtype"], data["eos_token_id"], data["tokens"]) == ("uint32", 0, sum(map(len, got)))
    model_tokenizer = (tmp_path / "model" / "tokenizer.json").read_bytes()
    assert (
        out / "tokenizer.json"
    ).read_bytes() == model_tokenizer  # the tokenizer it was made with, as it is
    assert data["settings"]["tokenizer_sha256"] == hashlib.sha256(model_tokenizer).hexdigest()


def test_every_shard_size_and_task_count_gives_the_documents(tmp_path):
    """datatrove opens a new shard after any document that takes a task past `--shard-tokens`, its last one
    included; that shard stays empty (at 1 token a shard, always): the folder has no empty shard, and its documents
    and totals are the tokenizer's at every size (documents longer than a shard among them) and task count (more
    tasks than files too)."""
    long = [" ".join(_texts(12, seed=3 + i)) for i in range(2)]  # ~1,000 tokens each
    texts = MIXED + _texts(30, seed=4) + long
    parts = [texts[i::3] for i in range(3)]
    corpus = tmp_path / "corpus"
    write_corpus(
        {corpus / n: [{"text": t} for t in p] for n, p in zip(["a.jsonl", "b.jsonl.zst", "c.parquet"], parts)}
    )
    runs = [(tmp_path / f"{s}-{t}", s, t) for s in (1, 13, 200, 5000) for t in (1, 2, 5)]
    prepare_each(BASE_DIR, [corpus], runs)
    for folder, shard_tokens, tasks in runs:
        got, data = documents(folder), json.loads((folder / "data.json").read_text())
        assert Counter(got) == _expected(texts), (shard_tokens, tasks)
        assert all(0 < s["tokens"] < shard_tokens + max(map(len, got)) for s in data["shards"])
        assert (data["tokens"], data["documents"]) == (sum(map(len, got)), len(texts))
        assert sorted(p.name for p in folder.glob("part-*.npy")) == sorted(s["path"] for s in data["shards"])
    assert len(json.loads((tmp_path / "1-1" / "data.json").read_text())["shards"]) == len(texts)


def test_a_closed_terminal_ends_the_printing_not_the_work(tmp_path):
    """`prepare_data.py ... 2>&1 | head -1`, its progress bar on: the folder whole, exit 0 (once: exit 1)."""
    texts = _texts(20, seed=5)
    write_corpus({tmp_path / "a.jsonl": [{"text": t} for t in texts]})
    command = [str(DATA_PYTHON), str(SCRIPT), "--model", str(BASE_DIR), "--output", str(tmp_path / "out"),
               "--workers", "1", str(tmp_path / "a.jsonl")]  # fmt: skip
    assert run_to_head(command, env={**os.environ, "PYTHONPATH": str(ROOT)})[0] == 0
    assert Counter(documents(tmp_path / "out")) == _expected(texts)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """Four files of ~50 documents and one run of them in 4 tasks on every core (its folder)."""
    root = tmp_path_factory.mktemp("corpus")
    texts = _texts(200, seed=2)
    _corpus(root / "corpus", texts)
    prepare_data(
        "--model", str(BASE_DIR), "--output", str(root / "one"), "--tasks", "4", str(root / "corpus")
    )
    return root / "corpus", root / "one", texts


def test_two_machines_parts_join_into_the_documents_of_one(corpus, tmp_path):
    source, one, texts = corpus
    out, common = tmp_path / "two", ["--model", str(BASE_DIR), "--workers", "1", "--nodes", "2", str(source)]
    first = prepare_data(*common, "--output", str(out), "--node-rank", "0")
    assert "this machine's tasks are done" in first.stdout and not (out / "data.json").exists()
    early = prepare_data("--join", "--output", str(out), check=False)
    assert early.returncode == 1 and early.stderr.count("\n") == 1
    assert "2 of 4 tasks not done (2, 3)" in early.stderr and not (out / "data.json").exists()
    prepare_data(*common, "--output", str(out), "--node-rank", "1")
    prepare_data("--join", "--output", str(out))
    assert Counter(documents(out)) == Counter(documents(one)) == _expected(texts)
    for shard in json.loads((one / "data.json").read_text())["shards"]:  # the same tasks: the same shards
        assert (out / shard["path"]).read_bytes() == (one / shard["path"]).read_bytes()


def test_a_killed_run_continues_and_other_settings_are_refused(corpus, tmp_path):
    source, one, _ = corpus
    out = tmp_path / "killed"
    command = [str(DATA_PYTHON), str(SCRIPT), "--no-progress", "--model", str(BASE_DIR), "--output", str(out),
               "--tasks", "4", "--workers", "1", str(source)]  # fmt: skip
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    done = out / ".prepare" / "logs" / "completions"
    deadline = time.monotonic() + 300
    while not (done / "00000").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = sorted(p.name for p in done.iterdir())
    assert finished and len(finished) < 4 and not (out / "data.json").exists(), finished
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("part-00000-*")}

    other = prepare_data(
        "--model", str(BASE_DIR), "--output", str(out), "--tasks", "3", str(source), check=False
    )
    assert other.returncode == 1 and other.stderr.count("\n") == 1
    assert "was started with tasks=4 (now 3)" in other.stderr

    prepare_data(*command[3:])  # the same command again: the rest of the tasks
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("part-00000-*")} == kept  # task 0 not redone
    assert documents(out) == documents(one)

    shard = out / "part-00001-00000.npy"  # a finished folder with a shard cut short: that task is redone
    shard.write_bytes(shard.read_bytes()[:-4])
    again = prepare_data(*command[3:])
    assert "task 1: part-00001-00000.npy has" in again.stderr and "it is redone" in again.stderr
    assert documents(out) == documents(one)


def test_s3_inputs_and_output_on_a_real_s3_server(corpus, tmp_path):
    import boto3

    from .s3_server import loopback_s3

    source, one, _ = corpus
    with loopback_s3() as env:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        client.create_bucket(Bucket="corpora")
        for path in source.rglob("*.*"):
            client.upload_file(str(path), "corpora", f"text/{path.relative_to(source)}")
        prepare_data("--model", str(BASE_DIR), "--output", "s3://corpora/tokens/llama", "--workers", "1",
                     "s3://corpora/text/", env=env)  # fmt: skip
        got = tmp_path / "got"
        got.mkdir()
        for item in client.list_objects_v2(Bucket="corpora", Prefix="tokens/llama/")["Contents"]:
            name = item["Key"].removeprefix("tokens/llama/")
            if "/" not in name:  # the folder's files, not its .prepare/ state
                client.download_file("corpora", item["Key"], str(got / name))
    assert documents(got) == documents(one)
    assert (got / "tokenizer.json").read_bytes() == (BASE_DIR / "tokenizer.json").read_bytes()


def test_a_mix_writes_a_folder_per_source_and_the_fragment_of_both_trainers(corpus, tmp_path):
    source, _, _ = corpus
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        f"tokens: 1000000\nsources:\n  - name: web\n    inputs: [{source}/a.jsonl, {source}/b]\n    share: 0.75\n"
        f"  - name: papers\n    inputs: {source}/e.parquet\n    share: 0.25\n"
    )
    out = tmp_path / "mix"
    prepare_data("--model", str(BASE_DIR), "--mix", str(mix), "--output", str(out), "--workers", "1")
    fragment = json.loads((out / "mix.json").read_text())
    web, papers = fragment["sources"]
    tokens = {s: json.loads((out / s / "data.json").read_text())["tokens"] for s in ("web", "papers")}
    assert (web["source_name"], web["target_ratio"], papers["target_ratio"]) == ("web", 0.75, 0.25)
    assert web["tokens"] == tokens["web"] and papers["tokens"] == tokens["papers"]
    assert (
        web["max_repetition_ratio"] >= 0.75e6 / tokens["web"]
        and papers["max_repetition_ratio"] >= 0.25e6 / tokens["papers"]
    )
    repeats = {s: round(share * 1e6 / tokens[s]) for s, share in (("web", 0.75), ("papers", 0.25))}
    shards = {
        s: [f"{s}/{p['path']}" for p in json.loads((out / s / "data.json").read_text())["shards"]]
        for s in tokens
    }
    assert (
        fragment["ai2_olmo"]["paths"] == shards["web"] * repeats["web"] + shards["papers"] * repeats["papers"]
    )
    assert fragment["tokenizer"] == "web/tokenizer.json" and fragment["eos_token_id"] == 0
    from olmo_repo import RepoTrainConfig  # ai2-olmo reads the mix folder as its repeated paths

    config = ROOT / "olmo_repo" / "experiments" / "demo" / "configs" / "tiny-stage2-repo.yaml"
    cfg = RepoTrainConfig.load(config, [f"data_prefix={out}", f"data.paths=[{out}]"])
    assert cfg.data.paths == [f"{out}/{p}" for p in fragment["ai2_olmo"]["paths"]]

    kept = {p: p.stat().st_mtime_ns for p in out.glob("*/part-*.npy")}
    mix.write_text(mix.read_text().replace("0.75", "0.5").replace("0.25", "0.5"))
    prepare_data(
        "--model", str(BASE_DIR), "--mix", str(mix), "--output", str(out)
    )  # new shares: mix.json only
    assert [s["target_ratio"] for s in json.loads((out / "mix.json").read_text())["sources"]] == [0.5, 0.5]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/part-*.npy")} == kept


def _bad(tmp_path: Path, case: str) -> tuple[list[str], str]:
    """A command with one bad input, and the words its one line must say."""
    good = tmp_path / "good.jsonl"
    write_corpus({good: [{"text": "fine"}]})
    model, out = str(BASE_DIR), str(tmp_path / "out")
    if case == "missing input":
        return ["--model", model, "--output", out, str(tmp_path / "nope.jsonl")], "nope.jsonl does not exist"
    if case == "empty file":
        (tmp_path / "empty.jsonl").write_bytes(b"")
        return ["--model", model, "--output", out, str(tmp_path / "empty.jsonl")], "empty.jsonl is empty"
    if case == "not jsonl or parquet":
        (tmp_path / "notes.txt").write_text("text")
        return ["--model", model, "--output", out, str(tmp_path / "notes.txt")], "notes.txt is neither jsonl"
    if case == "record without text":
        write_corpus({tmp_path / "c.jsonl": [{"text": "a"}, {"body": "b"}]})
        return [
            "--model",
            model,
            "--output",
            out,
            str(good),
            str(tmp_path / "c.jsonl"),
        ], "line 2 has no 'text'"
    if case == "non-UTF-8 byte":
        write_corpus({tmp_path / "c.jsonl.gz": [{"text": "a"}, {"raw": b'{"text": "caf\xe9"}'.hex()}]})
        return ["--model", model, "--output", out, str(tmp_path / "c.jsonl.gz")], "line 2 is not UTF-8"
    if case.startswith("truncated"):  # a copy or download cut short: its last 40 bytes lost
        name = {
            "truncated gzip": "c.jsonl.gz",
            "truncated zstd": "c.jsonl.zst",
            "truncated parquet": "p.parquet",
        }
        path = tmp_path / name[case]
        write_corpus({path: [{"text": " ".join(_texts(30, seed=6))}]})
        path.write_bytes(path.read_bytes()[:-40])
        return ["--model", model, "--output", out, str(path)], f"{path} is truncated: "
    if case == "corrupt gzip":  # its checksum does not match its content
        whole = gzip.compress(b'{"text": "a"}\n' * 100)
        (tmp_path / "c.jsonl.gz").write_bytes(whole[:-8] + bytes(8))
        return [
            "--model",
            model,
            "--output",
            out,
            str(tmp_path / "c.jsonl.gz"),
        ], "is not a readable gzip file"
    if case == "no document":  # every text empty: datatrove skips such records, and the folder had 0 tokens
        write_corpus({tmp_path / "c.jsonl": [{"text": ""}] * 3, tmp_path / "p.parquet": [{"text": ""}]})
        return ["--model", model, "--output", out, str(tmp_path / "c.jsonl"), str(tmp_path / "p.parquet")], (
            "holds no document: every record's text is empty"
        )
    if case == "parquet without text":
        write_corpus({tmp_path / "p.parquet": [{"body": "b"}]})
        return ["--model", model, "--output", out, str(tmp_path / "p.parquet")], "has no column 'text'"
    if case == "unreadable tokenizer":
        shutil.copytree(BASE_DIR, tmp_path / "model")
        (tmp_path / "model" / "tokenizer.json").write_text('{"model": 1}')
        return [
            "--model",
            str(tmp_path / "model"),
            "--output",
            out,
            str(good),
        ], "is not a readable tokenizer.json"
    if case == "output holds other files":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.md").write_text("mine")
        return [
            "--model",
            model,
            "--output",
            out,
            str(good),
        ], "holds files this command does not write (notes.md)"
    assert case == "mix shares"
    (tmp_path / "mix.yaml").write_text(
        f"tokens: 10\nsources:\n  - {{name: a, inputs: [{good}], share: 0.5}}\n"
    )
    return [
        "--model",
        model,
        "--mix",
        str(tmp_path / "mix.yaml"),
        "--output",
        out,
    ], "the shares sum to 0.5, not 1"


@pytest.mark.parametrize(
    "case",
    ["missing input", "empty file", "not jsonl or parquet", "record without text", "non-UTF-8 byte",
     "truncated gzip", "truncated zstd", "truncated parquet", "corrupt gzip", "no document", "parquet without text",
     "unreadable tokenizer", "output holds other files", "mix shares"],
)  # fmt: skip
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, case):
    args, words = _bad(tmp_path, case)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = prepare_data(*args, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("prepare_data.py: error: ") and words in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_datatrove_is_the_version_its_seam_was_written_against():
    check = (
        "from importlib.metadata import version; from olmo_repo.upstream import source_hash; "
        "from olmo_repo.upstream import datatrove as d; assert version('datatrove') == d.VERSION; "
        "assert {n: source_hash(n) for n in d.CANARIES} == d.CANARIES, 're-read olmo_repo/upstream/datatrove.py'"
    )
    subprocess.run([str(DATA_PYTHON), "-c", check], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_ai2_olmo_reads_a_data_folder_and_a_mix_and_checks_their_tokenizer(corpus, tmp_path):
    """`data.paths` naming a data folder or a mix folder stands for its shards (a mix's repeated), uint32; its
    memmap dataset reads the shards' ids; the preflight compares each folder's recorded tokenizer."""
    import numpy as np
    from olmo.data import build_memmap_dataset

    from olmo_repo import RepoTrainConfig
    from olmo_repo.ai2olmo.preflight import _check_tokenizer
    from olmo_repo.errors import RepoError

    _, one, _ = corpus
    config = ROOT / "olmo_repo" / "experiments" / "demo" / "configs" / "tiny-stage2-repo.yaml"
    overrides = [f"data_prefix={one}", f"data.paths=[{one}]", "data.memmap_dtype=uint16"]
    cfg = RepoTrainConfig.load(config, overrides)
    shards = [str(one / s["path"]) for s in json.loads((one / "data.json").read_text())["shards"]]
    assert cfg.data.paths == shards and cfg.data.memmap_dtype == "uint32"
    dataset = build_memmap_dataset(cfg, cfg.data)
    first = np.fromfile(shards[0], dtype="<u4")[: cfg.model.max_sequence_length]
    assert dataset[0]["input_ids"].tolist() == first.tolist()
    assert _check_tokenizer(cfg) == []

    empty = (
        tmp_path / "empty"
    )  # a folder of inputs with empty texts, as once written: named, on both trainers
    shutil.copytree(one, empty)
    manifest = json.loads((empty / "data.json").read_text())
    (empty / "data.json").write_text(json.dumps({**manifest, "tokens": 0, "documents": 0, "shards": []}))
    with pytest.raises(RepoError, match=rf"^{empty} holds no tokens: its inputs had no document"):
        RepoTrainConfig.load(config, [f"data_prefix={empty}", f"data.paths=[{empty}]"])

    other = _swapped_tokenizer(tmp_path / "other.json")
    problems = _check_tokenizer(RepoTrainConfig.load(config, [*overrides, f"tokenizer.identifier={other}"]))
    assert len(problems) == 1 and f"{one} was made with another tokenizer" in problems[0]

    lost = tmp_path / "lost"  # the tokenizer its data.json names is gone: said, as on OLMo-core
    shutil.copytree(one, lost)
    (lost / json.loads((lost / "data.json").read_text())["tokenizer"]).unlink()
    lost_overrides = [
        f"data_prefix={lost}",
        f"data.paths=[{lost}]",
        f"tokenizer.identifier={BASE_DIR / 'tokenizer.json'}",
    ]
    problems = _check_tokenizer(RepoTrainConfig.load(config, lost_overrides))
    assert problems == [
        f"{lost}/tokenizer.json is missing: the tokenizer {lost} was made with (its data.json names it): make it "
        "with the model's tokenizer (scripts/prepare_data.py --model)"
    ]


def test_ai2_olmo_reads_a_data_folder_on_s3_and_checks_its_tokenizer(corpus, tmp_path, monkeypatch):
    """`data.paths=[s3://...]` naming a data folder (prepare_data.py writes to S3 too) stands for its shards there,
    and the preflight compares the tokenizer the folder records there, as for a local one (OLMo-core's side:
    tests/core/test_data_folders.py)."""
    import boto3

    from olmo_repo import RepoTrainConfig
    from olmo_repo.ai2olmo.preflight import _check_tokenizer

    from .s3_server import loopback_s3

    _, one, _ = corpus
    with loopback_s3() as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="data")
        for file in one.rglob("*"):
            if file.is_file():
                s3.upload_file(str(file), "data", f"one/{file.relative_to(one)}")
        config = ROOT / "olmo_repo" / "experiments" / "demo" / "configs" / "tiny-stage2-repo.yaml"
        overrides = [f"data_prefix={one}", "data.paths=[s3://data/one/]", "data.memmap_dtype=uint16"]
        cfg = RepoTrainConfig.load(config, overrides)
        shards = [s["path"] for s in json.loads((one / "data.json").read_text())["shards"]]
        assert cfg.data.paths == [f"s3://data/one/{s}" for s in shards] and cfg.data.memmap_dtype == "uint32"
        assert _check_tokenizer(cfg) == []
        other = _swapped_tokenizer(tmp_path / "other.json")
        (problem,) = _check_tokenizer(
            RepoTrainConfig.load(config, [*overrides, f"tokenizer.identifier={other}"])
        )
        assert problem.startswith("s3://data/one was made with another tokenizer than tokenizer.identifier=")


def _swapped_tokenizer(path: Path) -> Path:
    """The demo's tokenizer with two tokens' ids swapped: the same size, another tokenizer."""
    data = json.loads((BASE_DIR / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    (a, i), (b, j) = list(vocab.items())[100:102]
    vocab[a], vocab[b] = j, i
    path.write_text(json.dumps(data))
    return path


def test_ai2_olmo_checks_the_tokenizer_tokenize_text_wrote_beside_its_data(tmp_path):
    """A train.npy of scripts/tokenize_text.py, with the tokenizer.json it was made with beside: the preflight
    compares that one with the config's, as OLMo-core's does, whatever tokenizer the config names."""
    import numpy as np

    from olmo_repo import RepoTrainConfig
    from olmo_repo.ai2olmo.preflight import _check_tokenizer

    data = tmp_path / "data"
    data.mkdir()
    np.arange(2048, dtype=np.uint32).tofile(data / "train.npy")
    config = ROOT / "olmo_repo" / "experiments" / "demo" / "configs" / "tiny-stage2-repo.yaml"
    overrides = [
        f"data.paths=[{data / 'train.npy'}]",
        "data.memmap_dtype=uint32",
        f"tokenizer.identifier={BASE_DIR / 'tokenizer.json'}",  # not the config's runs/demo/data: a fresh clone has none
    ]
    shutil.copy(BASE_DIR / "tokenizer.json", data / "tokenizer.json")
    assert _check_tokenizer(RepoTrainConfig.load(config, overrides)) == []
    _swapped_tokenizer(data / "tokenizer.json")
    (problem,) = _check_tokenizer(RepoTrainConfig.load(config, overrides))
    assert problem.startswith(
        f"data.paths: {data / 'train.npy'} was made with {data / 'tokenizer.json'}, another"
    )
