"""The OLMo-core side of `scripts/prepare_data.py`'s folders (`olmo_repo.olmocore.train.on_data_root`,
`check_experiment`): a data folder's shards and a mix's source mixture are what the config reads, and before step
0 every folder the run reads (each source of a mix) must be finished and made with the model's tokenizer, checked
from the tokenizer.json it records; one line naming the folder otherwise. The folders are written here in the
layout `olmo_repo.data.folder` describes (the command itself is tested in tests/test_prepare_data.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from olmo_repo.data.folder import DATA_FORMAT, MIX_FORMAT
from olmo_repo.errors import RepoError
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.olmocore.checks import check_experiment
from olmo_repo.olmocore.train import load_build_config

from .training import ROOT, tiny_options

QWEN = ROOT / "configs" / "olmocore" / "tiny-qwen3-repo.py"


def _folder(root: Path, tokenizer: Path = BASE_DIR / "tokenizer.json", eos: int = 0) -> Path:
    """A finished data folder of 64 windows of 512 random ids, made (it says) with `tokenizer`."""
    root.mkdir(parents=True)
    np.random.default_rng(0).integers(2, 4096, 64 * 512, dtype=np.uint32).tofile(
        root / "part-00000-00000.npy"
    )
    shutil.copyfile(tokenizer, root / "tokenizer.json")
    (root / ".prepare").mkdir()
    (root / ".prepare" / "settings.json").write_text("{}")  # the run's first file
    shard = {"path": "part-00000-00000.npy", "tokens": 64 * 512, "documents": 1}
    manifest = {"format": DATA_FORMAT, "tokenizer": "tokenizer.json", "eos_token_id": eos, "vocab_size": 4096,
                "dtype": "uint32", "tokens": 64 * 512, "documents": 1, "settings": {}, "shards": [shard]}  # fmt: skip
    (root / "data.json").write_text(json.dumps(manifest))
    return root


def _mix(root: Path, b_tokenizer: Path = BASE_DIR / "tokenizer.json") -> Path:
    _folder(root / "a")
    _folder(root / "b", b_tokenizer)
    sources = [dict(source_name=s, target_ratio=0.5, max_repetition_ratio=1.0, paths=[f"{s}/part-00000-00000.npy"],
                    tokens=64 * 512, documents=1, ai2_olmo_repeat=1) for s in "ab"]  # fmt: skip
    fragment = {"format": MIX_FORMAT, "tokens": 16384, "tokenizer": "a/tokenizer.json", "sources": sources}
    (root / "mix.json").write_text(json.dumps(fragment))
    return root


def _config(data: Path, save: Path):
    return load_build_config(QWEN)(tiny_options(save, data), ["--trainer.callbacks.niah.enabled=false"])


def test_a_data_folder_and_a_mix_are_what_the_config_reads(tmp_path):
    config = _config(_folder(tmp_path / "data"), tmp_path / "run")
    assert config.dataset.paths == [f"{tmp_path}/data/part-00000-00000.npy"]
    assert config.dataset.tokenizer.identifier == f"{tmp_path}/data/tokenizer.json"
    check_experiment(config, world_size=2)

    config = _config(_mix(tmp_path / "mix"), tmp_path / "run2")
    sources = config.dataset.source_mixture_config.source_list.sources
    assert [(s.source_name, s.target_ratio, s.paths) for s in sources] == [
        (s, 0.5, [f"{tmp_path}/mix/{s}/part-00000-00000.npy"]) for s in "ab"
    ]
    assert config.dataset.source_mixture_config.requested_tokens == 16384
    check_experiment(config, world_size=2)


def test_a_source_made_with_another_tokenizer_or_end_id_or_unfinished_is_named(tmp_path):
    other = tmp_path / "other.json"  # the demo's tokenizer with two tokens' ids swapped
    data = json.loads((BASE_DIR / "tokenizer.json").read_text())
    (a, i), (b, j) = list(data["model"]["vocab"].items())[100:102]
    data["model"]["vocab"][a], data["model"]["vocab"][b] = j, i
    other.write_text(json.dumps(data))
    config = _config(_mix(tmp_path / "mix", other), tmp_path / "run")
    with pytest.raises(RepoError, match=rf"^{tmp_path}/mix/b was made with {tmp_path}/mix/b/tokenizer.json, not "
                       r"the tokenizer of dataset.tokenizer.identifier.*2 of 4096 tokens differ"):  # fmt: skip
        check_experiment(config, world_size=2)

    (
        tmp_path / "mix" / "b" / "tokenizer.json"
    ).unlink()  # the tokenizer its data.json names: said, as on ai2-olmo
    with pytest.raises(RepoError, match=rf"^{tmp_path}/mix/b/tokenizer.json is missing: the tokenizer "
                       rf"{tmp_path}/mix/b was made with \(its data.json names it\): make it with the model's"):  # fmt: skip
        check_experiment(_config(tmp_path / "mix", tmp_path / "run1"), world_size=2)

    config = _config(_folder(tmp_path / "eos", eos=1), tmp_path / "run2")
    with pytest.raises(
        RepoError, match=r"eos ends documents with id 1, but dataset.tokenizer.eos_token_id=0"
    ):
        check_experiment(config, world_size=2)

    manifest = json.loads((tmp_path / "eos" / "data.json").read_text())  # inputs of empty texts, once written
    empty = {**manifest, "tokens": 0, "documents": 0, "shards": []}
    (tmp_path / "eos" / "data.json").write_text(json.dumps(empty))
    with pytest.raises(RepoError, match=rf"^{tmp_path}/eos holds no tokens: its inputs had no document"):
        _config(tmp_path / "eos", tmp_path / "run4")

    (tmp_path / "eos" / "data.json").unlink()  # a run not finished (or not joined): its manifest is missing
    with pytest.raises(RepoError, match=r"eos has no data.json: not a finished data folder"):
        _config(tmp_path / "eos", tmp_path / "run3")


def test_a_mix_on_s3_is_read_and_checked_as_a_local_one(tmp_path, monkeypatch):
    """`--data-root=s3://...` (prepare_data.py writes there too): the mix's sources read from the bucket, its
    tokenizer as a local copy, and a source made with another tokenizer named before step 0, as locally."""
    import boto3

    from ..s3_server import loopback_s3

    other = tmp_path / "other.json"  # the demo's tokenizer with two tokens' ids swapped
    data = json.loads((BASE_DIR / "tokenizer.json").read_text())
    (a, i), (b, j) = list(data["model"]["vocab"].items())[100:102]
    data["model"]["vocab"][a], data["model"]["vocab"][b] = j, i
    other.write_text(json.dumps(data))
    _mix(tmp_path / "good")
    _mix(tmp_path / "bad", other)
    with loopback_s3() as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="data")
        for file in (tmp_path / "good").rglob("*"):
            for mix in ("good", "bad"):
                local = tmp_path / mix / file.relative_to(tmp_path / "good")
                if local.is_file():
                    s3.upload_file(str(local), "data", f"{mix}/{local.relative_to(tmp_path / mix)}")
        config = _config("s3://data/good/", tmp_path / "run")
        sources = config.dataset.source_mixture_config.source_list.sources
        assert [s.paths for s in sources] == [[f"s3://data/good/{s}/part-00000-00000.npy"] for s in "ab"]
        copy = Path(config.dataset.tokenizer.identifier)  # what in-loop NIAH and the checks read
        assert copy.is_file() and copy.read_bytes() == (BASE_DIR / "tokenizer.json").read_bytes()
        check_experiment(config, world_size=2)

        config = _config("s3://data/bad", tmp_path / "run2")
        with pytest.raises(RepoError, match=r"^s3://data/bad/b was made with s3://data/bad/b/tokenizer.json, not "
                           r"the tokenizer of dataset.tokenizer.identifier.*2 of 4096 tokens differ"):  # fmt: skip
            check_experiment(config, world_size=2)
        s3.delete_object(Bucket="data", Key="bad/b/data.json")  # unfinished (or not joined)
        with pytest.raises(RepoError, match=r"^s3://data/bad/b has no data.json: not a finished data folder"):
            check_experiment(_config("s3://data/bad", tmp_path / "run3"), world_size=2)
