"""scripts/fetch.py against a real loopback HTTP server (ranges, ETags, faults) and a real S3 (moto): the plan,
resumed and verified downloads, the faults of a real network and disk, and the proof that training on the
copies reads the same tokens as training on the server."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from olmo_repo import RepoTrainConfig
from olmo_repo.cli.fetch import main
from olmo_repo.fetch.remote import CHUNK
from olmo_repo.fetch.targets import MANIFEST, PART, LocalTarget
from olmo_repo.fetch.transfer import INTERRUPTING

from .fetch_server import FileServer, Served
from .training import ROOT, STAGE1, free_port, losses, make_trainer, small, subprocess_env, write_corpus

pytestmark = pytest.mark.slow  # subprocesses, lm-eval prompt building, loopback servers

FETCH = ROOT / "scripts/fetch.py"
CKPT = "ckpt/step5-unsharded"


def _tokens(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(2, 128, n, dtype=np.uint32).tobytes()


@pytest.fixture
def served() -> Served:
    """stage1.npy and val.npy (token ids), a tokenizer file and an unsharded checkpoint's four files."""
    s = Served()
    s.files["data/stage1.npy"] = _tokens(200_000, 1)  # 800 KB: several chunks
    s.files["data/val.npy"] = _tokens(20_000, 2)
    s.files["tok/tokenizer.json"] = b'{"not": "parsed by fetch"}'
    for i, name in enumerate(("config.yaml", "model.pt", "optim.pt", "train.pt")):
        s.files[f"{CKPT}/{name}"] = np.random.default_rng(10 + i).bytes(30_000)
    return s


@pytest.fixture
def server(served):
    with FileServer(served) as srv:
        yield srv


def _args(server: FileServer, to: Path | str, *extra: str) -> list[str]:
    """The tiny stage-1 config reading everything from the server."""
    return [
        str(STAGE1),
        "--to",
        str(to),
        "--no-progress",
        "--retries=3",
        "--timeout=10",
        f"--data_prefix={server.url('data')}",
        f"--tokenizer.identifier={server.url('tok/tokenizer.json')}",
        f"--load_path={server.url(CKPT)}",
        *extra,
    ]


def _copy(to: Path, server: FileServer, path: str) -> Path:
    return to / f"127.0.0.1_{server.httpd.server_address[1]}" / path


def _assert_complete(to: Path, server: FileServer) -> None:
    """Every served file has a byte-identical copy and no partial file is left anywhere."""
    for path, data in server.served.files.items():
        assert _copy(to, server, path).read_bytes() == data, path
    assert not [p for p in to.rglob(f"*{PART}*")]


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """{path under root: (bytes, mtime in ns)} of every file: what a rerun must leave as it was."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def _contents(root: Path) -> dict[str, bytes]:
    return {path: data for path, (data, _) in _tree(root).items()}


def test_help_and_argument_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--to",
        "--dry-run",
        "--only",
        "--jobs",
        "--retries",
        "--timeout",
        "--staging",
        "--no-progress",
    ):
        assert flag in out
    with pytest.raises(SystemExit) as e:
        main([str(STAGE1)])  # no --to
    assert e.value.code == 2 and "--to" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(STAGE1), "--to", "x", "stray"])
    assert e.value.code == 2 and "--key=value" in capsys.readouterr().err
    assert main(["configs/nope.yaml", "--to", "x"]) == 1
    assert capsys.readouterr().err == (
        "fetch.py: error: config file configs/nope.yaml does not exist (expected a YAML file such as configs/*.yaml)\n"
    )
    assert main([str(STAGE1), "--to", "ftp://host/x"]) == 1
    assert "ftp:// is not a supported target" in capsys.readouterr().err


def test_unreachable_server_is_one_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code = main([str(STAGE1), "--to", str(tmp_path / "out"), f"--data_prefix={url}/data", "--only=data"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "unreachable" in err and "Connection refused" in err
    assert not (tmp_path / "out").exists()


def test_dry_run_plans_and_writes_nothing(server, tmp_path, capsys):
    to = tmp_path / "out"
    assert main(_args(server, to, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert f"-> {to} (free: " in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:6]}
    assert lines["data"][2] == "2"  # stage1.npy and the tokenizer
    assert lines["eval"][2] == "1" and lines["checkpoint"][2] == "4"
    assert lines["total"][1:] == ["7", "976.6", "KiB", "976.6", "KiB"]
    assert not to.exists() and server.served.get_requests() == []  # HEAD requests only


def test_only_and_reset_flags_narrow_the_files(server, tmp_path, capsys):
    args = _args(server, tmp_path / "out", "--dry-run", "--only=checkpoint", "--reset_optimizer_state=true")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "checkpoint" in out and "\n  data " not in out and "\n  eval " not in out
    assert out.splitlines()[-1].split()[1] == "3"  # config.yaml, model.pt, train.pt (no optim.pt)


def test_fetch_resumes_a_dropped_file_verifies_and_a_rerun_downloads_nothing(server, tmp_path, capsys):
    to = tmp_path / "out"
    served = server.served
    served.drop_after["data/stage1.npy"] = 300_000  # the connection ends mid-file, once
    assert main(_args(server, to)) == 0
    out = capsys.readouterr().out
    _assert_complete(to, server)
    # The second request for the dropped file continued where the first stopped (after whole chunks).
    ranges = [r for m, p, r in served.log if m == "GET" and p == "data/stage1.npy"]
    assert ranges == [None, "bytes=262144-"]
    manifest = json.loads((to / MANIFEST).read_text())
    record = manifest["files"][f"127.0.0.1_{server.httpd.server_address[1]}/data/stage1.npy"]
    assert (
        record["size"] == 800_000
        and record["md5"] == hashlib.md5(served.files["data/stage1.npy"]).hexdigest()
    )

    config = to / "tiny-stage1-rope.yaml"
    assert out.splitlines()[-1] == f"config: {config}"
    cfg = RepoTrainConfig.load(config, validate_paths=False)
    assert cfg.data.paths == [str(_copy(to, server, "data/stage1.npy"))]
    val = next(e for e in cfg.evaluators if e.label == "tiny-val")  # the NIAH entries read no file
    assert val.data.paths == [str(_copy(to, server, "data/val.npy"))]
    assert cfg.tokenizer.identifier == str(_copy(to, server, "tok/tokenizer.json"))
    assert cfg.load_path == str(_copy(to, server, CKPT))
    assert cfg.run_name == "tiny-stage1-rope" and cfg.save_folder == "runs/tiny-stage1-rope"  # the rest as is

    # A rerun downloads nothing, says so, and leaves every file (copies, manifest, config) as it was.
    served.log.clear()
    before = _tree(to)
    assert main(_args(server, to)) == 0
    assert served.get_requests() == []  # verified copies: nothing downloaded
    out = capsys.readouterr().out
    assert "7 file(s) already fetched and unchanged" in out and "fetched 0 file(s), 0 B" in out
    assert _tree(to) == before

    # A file that changed on the server since: only it is fetched again, and the summary says so.
    served.files["data/val.npy"] = _tokens(21_000, 3)
    assert main(_args(server, to)) == 0
    assert "1 file(s) changed on the server since they were fetched" in capsys.readouterr().out
    assert served.get_requests() == ["data/val.npy"]
    _assert_complete(to, server)


def test_a_missing_file_is_reported_and_a_rerun_completes(server, tmp_path, capsys):
    to = tmp_path / "out"
    server.served.missing.add(f"{CKPT}/optim.pt")
    assert main(_args(server, to)) == 1
    out = capsys.readouterr().out
    assert "1 file(s) cannot be fetched:\n    load_path: " in out and "optim.pt: not found (HTTP 404)" in out
    assert "incomplete: no config written" in out and not (to / "tiny-stage1-rope.yaml").exists()
    assert _copy(to, server, "data/stage1.npy").is_file()
    assert not _copy(to, server, f"{CKPT}/optim.pt").exists()

    server.served.missing.clear()
    server.served.log.clear()
    assert main(_args(server, to)) == 0
    assert server.served.get_requests() == [f"{CKPT}/optim.pt"]
    _assert_complete(to, server)


def test_a_file_changed_during_the_fetch_leaves_nothing_and_a_rerun_completes(server, tmp_path, capsys):
    to = tmp_path / "out"
    served = server.served

    def change_once(path: str) -> None:  # between the plan's HEAD and the GET
        if path == "data/val.npy" and served.before_get is not None:
            served.before_get = None
            served.files[path] = _tokens(25_000, 4)

    served.before_get = change_once
    assert main(_args(server, to)) == 1
    out = capsys.readouterr().out
    assert "changed on the server while fetching" in out and re.search(
        r"evaluators\[\d+\]\.data\.paths\[0\]", out
    )
    assert not _copy(to, server, "data/val.npy").exists()
    assert not list(to.rglob(f"*{PART}*"))
    assert main(_args(server, to)) == 0
    _assert_complete(to, server)


def test_a_file_user_owns_is_never_overwritten(server, tmp_path, capsys):
    to = tmp_path / "out"
    mine = _copy(to, server, "data/val.npy")
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"mine")
    assert main(_args(server, to)) == 1
    assert "exists and was not written by fetch" in capsys.readouterr().err
    assert mine.read_bytes() == b"mine" and not (to / MANIFEST).exists()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_full_disk_before_and_during_the_fetch(server, tiny_disk, capsys):
    served = server.served
    # Before: 977 KiB of files but the plan sees less free space; nothing is written.
    (tiny_disk / "other").write_bytes(b"x" * 200_000)
    assert main(_args(server, tiny_disk / "out")) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fetch.py: error: --to {tiny_disk / 'out'}: 976.6 KiB to download but only ")
    assert "free some space or choose another --to" in err and not (tiny_disk / "out").exists()

    # During: space is enough at the plan, then another writer fills the disk.
    (tiny_disk / "other").unlink()

    def fill(path: str) -> None:
        if path == "data/stage1.npy" and served.before_get is not None:
            served.before_get = None
            (tiny_disk / "other").write_bytes(b"x" * 600_000)

    served.before_get = fill
    assert main(_args(server, tiny_disk / "out", "--jobs=1")) == 1
    out = capsys.readouterr().out
    assert "disk full (" in out and "No space left on device" in out and "free space at" in out
    for path, data in served.files.items():  # whatever is under a final name is complete
        copy = _copy(tiny_disk / "out", server, path)
        assert not copy.exists() or copy.read_bytes() == data
    # The user frees space: the other file, and more (the 1 MiB left ~40 KiB beyond the files' bytes, which
    # the filesystem's pages and the fetch's part records can take).
    (tiny_disk / "other").unlink()
    subprocess.run(["mount", "-o", "remount,size=2m", str(tiny_disk)], check=True)
    assert main(_args(server, tiny_disk / "out")) == 0
    _assert_complete(tiny_disk / "out", server)


def test_the_manifest_names_a_file_before_it_takes_its_name(server, tmp_path, monkeypatch):
    """A kill between the two leaves a file the rerun knows as its own: the claim comes first, while the
    verified download is still under its partial name."""
    to = tmp_path / "out"
    claim = LocalTarget.claim
    seen = []

    def checked(self, name, remote, md5):
        path = self.root / name
        seen.append(name)
        assert not path.exists() and path.with_name(path.name + PART).stat().st_size == remote.size, name
        claim(self, name, remote, md5)

    monkeypatch.setattr(LocalTarget, "claim", checked)
    assert main(_args(server, to)) == 0
    assert len(seen) == len(server.served.files)
    _assert_complete(to, server)


@pytest.mark.slow
def test_sigint_half_way_then_a_rerun_resumes(server, tmp_path, capsys):
    to = tmp_path / "out"
    served = server.served
    served.hold["data/stage1.npy"] = 2 * CHUNK  # the fetch is mid-file when SIGINT comes
    # A shell's background job (`make test &`, nohup) ignores SIGINT, and a child inherits an ignored signal:
    # the fetch gets the default disposition, as from a terminal, whatever ran the suite.
    ours = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, str(FETCH), *_args(server, to)],
            env=subprocess_env(PYTHONPATH=str(ROOT)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ours)
    part = _copy(to, server, "data/stage1.npy" + PART)
    deadline = time.monotonic() + 300  # the process imports ai2-olmo first: slow on a busy machine
    while not (part.is_file() and part.stat().st_size > 0):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    said = []  # the next chunk is released once the fetch has taken the SIGINT (else it may finish the file)
    while (line := proc.stderr.readline()) and INTERRUPTING not in line:
        said.append(line)
    served.release.set()
    out, err = proc.communicate(timeout=300)
    err = "".join(said) + line + err
    assert INTERRUPTING in err, out + err
    assert proc.returncode == 130, out + err
    assert "interrupted:" in out and "Traceback" not in err, out + err
    assert part.stat().st_size > 0 and not _copy(to, server, "data/stage1.npy").exists(), out + err
    for path, data in served.files.items():
        copy = _copy(to, server, path)
        assert not copy.exists() or copy.read_bytes() == data, path

    served.hold.clear()
    served.log.clear()
    assert main(_args(server, to)) == 0
    (rng,) = [r for m, p, r in served.log if m == "GET" and p == "data/stage1.npy"]
    assert rng is not None and rng.startswith("bytes=")  # resumed, not restarted
    _assert_complete(to, server)


def test_a_killed_fetch_and_its_rerun_give_what_one_clean_run_gives(server, tmp_path, capsys):
    to = tmp_path / "out"
    served = server.served
    assert main(_args(server, to)) == 0
    clean = _contents(to)
    assert set(clean) >= {MANIFEST, "tiny-stage1-rope.yaml"}
    shutil.rmtree(to)

    served.hold["data/stage1.npy"] = 2 * CHUNK  # the fetch is mid-file when the kill comes
    proc = subprocess.Popen(
        [sys.executable, str(FETCH), *_args(server, to)],
        env=subprocess_env(PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    part = _copy(to, server, "data/stage1.npy" + PART)
    deadline = time.monotonic() + 300  # the process imports ai2-olmo first: slow on a busy machine
    while not (part.is_file() and part.stat().st_size > 0):
        assert time.monotonic() < deadline and proc.poll() is None, "the fetch did not start"
        time.sleep(0.01)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    served.release.set()
    assert not (to / "tiny-stage1-rope.yaml").exists()  # no config before every file is there

    served.hold.clear()
    served.log.clear()
    capsys.readouterr()
    assert main(_args(server, to)) == 0
    assert "partly fetched: resume" in capsys.readouterr().out
    (rng,) = [r for m, p, r in served.log if m == "GET" and p == "data/stage1.npy"]
    assert rng is not None and rng.startswith("bytes=")  # resumed, not restarted
    assert _contents(to) == clean  # byte for byte, manifest and config included; no partial file left


@pytest.fixture
def s3(monkeypatch):
    """A real S3 API (moto's server) on loopback, and boto3 pointed at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        yield boto3.client("s3")
    finally:
        moto.stop()


def test_s3_target_uploads_verified_copies_and_a_rerun_uploads_nothing(server, s3, tmp_path, capsys):
    s3.create_bucket(Bucket="mirror")
    staging = tmp_path / "staging"
    args = _args(server, "s3://mirror/olmo", f"--staging={staging}")
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        f"config: {staging}/tiny-stage1-rope.yaml",
        "config: s3://mirror/olmo/tiny-stage1-rope.yaml",
    ]
    host = f"127.0.0.1_{server.httpd.server_address[1]}"
    for path, data in server.served.files.items():
        obj = s3.get_object(Bucket="mirror", Key=f"olmo/{host}/{path}")
        assert obj["Body"].read() == data, path
        assert obj["Metadata"]["fetch-url"] == server.url(path)
    assert sorted(p.name for p in staging.rglob("*") if p.is_file()) == ["tiny-stage1-rope.yaml"]
    cfg = RepoTrainConfig.load(staging / "tiny-stage1-rope.yaml", validate_paths=False)
    assert cfg.data.paths == [f"s3://mirror/olmo/{host}/data/stage1.npy"]
    assert cfg.load_path == f"s3://mirror/olmo/{host}/{CKPT}"

    server.served.log.clear()
    assert main(args) == 0
    assert server.served.get_requests() == []
    assert "7 file(s) already fetched" in capsys.readouterr().out

    assert main([args[0], "--to", "s3://no-such-bucket/x", *args[3:]]) == 1
    assert "bucket no-such-bucket not reachable" in capsys.readouterr().err


def test_sharded_checkpoint_listed_from_s3(s3, tmp_path, capsys):
    s3.create_bucket(Bucket="ckpts")
    files = {
        "config.yaml": b"run_name: x\n",
        "model/.metadata": b"meta",
        "model/__0_0.distcp": np.random.default_rng(0).bytes(300_000),
        "train/rank0.pt": b"train",
    }
    for name, data in files.items():
        s3.put_object(Bucket="ckpts", Key=f"run/step3/{name}", Body=data)
    to = tmp_path / "out"
    assert main([str(STAGE1), "--to", str(to), "--only=checkpoint", "--load_path=s3://ckpts/run/step3"]) == 0
    for name, data in files.items():
        assert (to / "s3/ckpts/run/step3" / name).read_bytes() == data
    cfg = RepoTrainConfig.load(to / "tiny-stage1-rope.yaml", validate_paths=False)
    assert cfg.load_path == str(to / "s3/ckpts/run/step3")
    assert cfg.data.paths == ["runs/demo/data/stage1.npy"]  # --only=checkpoint: the data paths as they were


def _first_batches(config: Path | str, overrides: list[str], save: Path, device) -> tuple[list[str], list]:
    """Train two steps; return the data-indices lines and the token ids of those instances."""
    import gzip

    with make_trainer(config, [*overrides, f"save_folder={save}"], device) as trainer:
        trainer.fit()
        dataset = trainer.train_loader.dataset.dataset  # the MemMapDataset behind OLMo's IterableDataset
    # Closing the trainer closes the indices file.
    lines = gzip.decompress((save / "data-indices/rank0.tsv.gz").read_bytes()).decode().splitlines()
    indices = [int(i) for line in lines for i in line.split("\t")[1:]]
    return lines, [dataset[i]["input_ids"].tolist() for i in indices]


@pytest.mark.slow
def test_training_on_the_copies_reads_the_same_tokens_as_on_the_server(tmp_path, device, capsys):
    data = write_corpus(tmp_path / "corpus")
    served = Served(files={"data/stage1.npy": (data / "stage1.npy").read_bytes()})
    to = tmp_path / "copies"
    with FileServer(served) as server:
        remote = small(data, tmp_path / "unused", max_duration=2, stop_at=2, data_prefix=server.url("data"))
        assert main([str(STAGE1), "--to", str(to), "--no-progress", *[f"--{o}" for o in remote]]) == 0
        config = capsys.readouterr().out.splitlines()[-1].removeprefix("config: ")
        lines, tokens = _first_batches(STAGE1, remote, tmp_path / "from-server", device)
        assert any(p == "data/stage1.npy" and r for m, p, r in served.log if m == "GET")  # read over http
    # The server is gone: the copy's run can only read local files.
    local_lines, local_tokens = _first_batches(config, [], tmp_path / "from-copy", device)
    assert [line.split("\t")[0] for line in lines] == ["1", "2"] and len(tokens) == 8  # 2 steps x 4 instances
    assert local_lines == lines and local_tokens == tokens
    corpus = np.fromfile(data / "stage1.npy", dtype=np.uint32)
    assert all(len(t) == 32 and set(t) <= set(corpus.tolist()) for t in tokens)
    assert sorted(losses(tmp_path / "from-server")) == [1, 2]
    assert losses(tmp_path / "from-copy") == losses(tmp_path / "from-server")
