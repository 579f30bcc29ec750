"""Configs: every file loads, the official ones keep the released keys, bad values fail clearly."""

from __future__ import annotations

import pytest
import torch
from olmo.exceptions import OLMoConfigurationError
from olmo.util import clean_opt
from omegaconf import OmegaConf as om

from olmo_repo import RepoModelConfig, RepoTrainConfig, build_model, layer_modes, repo_layer_ids

from .conftest import CONFIGS, ROOT, tiny_config

RELEASED = CONFIGS / "released"
ALL_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "data")  # data/: mix files


def test_the_olmo2_stage2_mix_file_is_the_released_configs_sources_with_shares_summing_to_1():
    """configs/data/olmo2-stage2-mix.yaml (scripts/prepare_data.py --mix) reads as a mix of the 50B tokens of the
    released stage-2 config, one source per kind of its data paths."""
    from olmo_repo.data.mix import read_mix

    mix = read_mix(CONFIGS / "data" / "olmo2-stage2-mix.yaml")
    assert mix.tokens == 50_000_000_000 and abs(sum(s.share for s in mix.sources) - 1) < 1e-9
    assert [s.name for s in mix.sources] == ["dclm", "flan", "pes2o", "wiki", "stackexchange", "math"]


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_loads(path):
    config = RepoTrainConfig.load(path, validate_paths=False)
    assert isinstance(config.model, RepoModelConfig)


def _flat(path) -> dict:
    """Every key -> value of a YAML file, interpolations left as written."""
    container = om.to_container(om.load(path), resolve=False)
    out: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}{k}.", v)
        else:
            out[prefix[:-1]] = node

    walk("", container)
    return out


@pytest.mark.parametrize(
    "ours, released, changed",
    [
        (
            "official-1B-repo.yaml",
            "OLMo2-1B-stage2-seed42.yaml",
            {"model.pe_mode": "repo", "model.pe_start_layer": 5},
        ),
        (
            "official-7B-repo.yaml",
            "OLMo2-7B-stage2-seed42.yaml",
            {"model.pe_mode": "repo", "model.pe_start_layer": 10},
        ),
        ("baseline-1B-rope.yaml", "OLMo2-1B-stage2-seed42.yaml", {}),
        ("baseline-1B-nope.yaml", "OLMo2-1B-stage2-seed42.yaml", {"model.pe_mode": "nope"}),
        (
            "baseline-1B-r2n1.yaml",
            "OLMo2-1B-stage2-seed42.yaml",
            {"model.pe_mode": "nope", "model.pe_layer_ids": [2, 5, 8, 11, 14]},
        ),
        (
            "baseline-1B-n2r1.yaml",
            "OLMo2-1B-stage2-seed42.yaml",
            {"model.pe_mode": "nope", "model.pe_layer_ids": [0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15]},
        ),
    ],
)
def test_official_configs_are_the_released_ones_plus_the_listed_keys(ours, released, changed):
    a, b = _flat(CONFIGS / ours), _flat(RELEASED / released)
    header = (CONFIGS / ours).read_text().split("\n\n", 1)[0]
    # What may differ besides the RePo keys: the run name and (for 1B) the unwritable http save_folder.
    allowed = {"run_name"} | ({"save_folder"} if str(b.get("save_folder", "")).startswith("http") else set())
    for key in allowed:
        assert key in header, f"{ours}: changed key {key} is not listed at the top of the file"
    diff = {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}
    assert diff == allowed | set(changed)
    assert {k: a[k] for k in changed} == changed


def test_official_1b_repo_layers_and_parameter_cost():
    repo = RepoTrainConfig.load(CONFIGS / "official-1B-repo.yaml", validate_paths=False).model
    rope = RepoTrainConfig.load(CONFIGS / "baseline-1B-rope.yaml", validate_paths=False).model
    assert repo.init_device == "meta" and repo_layer_ids(repo) == list(range(5, 16))
    m_repo, m_rope = build_model(repo), build_model(rope)
    assert next(m_repo.parameters()).device == torch.device("meta")
    extra = m_repo.num_params() - m_rope.num_params()
    assert extra == 11 * (2 * 2048 * 256 + 256 * 16) == 11_579_392
    assert m_rope.num_params(include_embedding=False) == 1_279_395_840
    assert round(100 * extra / m_rope.num_params(include_embedding=False), 3) == 0.905


def test_official_7b_repo_layers():
    model = RepoTrainConfig.load(CONFIGS / "official-7B-repo.yaml", validate_paths=False).model
    assert repo_layer_ids(model) == list(range(10, 32))
    assert build_model(model).transformer.blocks[10].final_map.weight.shape == (32, 512)


def test_reference_fork_config_means_repo_from_layer_5():
    config = RepoTrainConfig.load(
        RELEASED / "RePo-OLMo2-1B-stage2-seed42-SEXMH-L5.yaml", validate_paths=False
    )
    assert config.model.pe_mode == "repo" and repo_layer_ids(config.model) == list(range(5, 16))
    assert config.data_prefix == "/home/huayang_sakana_ai/workspace/olmo_data"


@pytest.mark.slow
def test_data_prefix_is_a_local_copy_of_olmo_data_org(tmp_path):
    over_http = RepoTrainConfig.load(CONFIGS / "official-1B-repo.yaml", validate_paths=False)
    assert over_http.data.paths and all(p.startswith("http://olmo-data.org/") for p in over_http.data.paths)
    local = RepoTrainConfig.load(
        CONFIGS / "official-1B-repo.yaml", ["data_prefix=/data/olmo-data/"], validate_paths=False
    )
    assert local.data.paths == [
        p.replace("http://olmo-data.org", "/data/olmo-data") for p in over_http.data.paths
    ]
    local.save(tmp_path / "config.yaml")  # what a run saves, and loads again on resume: unchanged
    assert RepoTrainConfig.load(tmp_path / "config.yaml", validate_paths=False).data.paths == local.data.paths
    # Configs that write ${data_prefix} into their paths (the tiny ones, the reference fork's) use it as the root.
    tiny = RepoTrainConfig.load(
        ROOT / "olmo_repo/experiments/demo/configs/tiny-stage2-repo.yaml", ["data_prefix=/d"]
    )
    val = next(e for e in tiny.evaluators if e.label == "tiny-val")
    assert (tiny.data.paths, val.data.paths) == (["/d/stage2.npy"], ["/d/val.npy"])


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"dynamic_pe_mode": "nope", "dynamic_pe_layer_ids": "2,5"}, "RRNRRN"),
        ({"dynamic_pe_mode": "nope", "dynamic_pe_layer_ids": ""}, "NNNNNN"),
        ({"dynamic_pe_mode": "swigluex_multihead", "dynamic_pe_start_layer": 4}, "RRRRPP"),
        ({"dynamic_pe_mode": "none"}, "RRRRRR"),
    ],
)
def test_reference_keys_mean_the_same_thing(tmp_path, keys, expected):
    path = tmp_path / "c.yaml"
    base = {k: v for k, v in tiny_config(n_layers=6).asdict().items() if not k.startswith("pe_")}
    om.save(om.create({"model": {**base, **keys}}), path)
    config = RepoTrainConfig.load(path)
    assert "".join({"rope": "R", "nope": "N", "repo": "P"}[m] for m in layer_modes(config.model)) == expected


@pytest.mark.slow
def test_cli_overrides_and_saved_config_round_trip(tmp_path):
    args = ["--model.pe_mode=repo", "--model.pe_start_layer=3", "--model.init_device=meta"]
    config = RepoTrainConfig.load(
        CONFIGS / "baseline-1B-rope.yaml", [clean_opt(a) for a in args], validate_paths=False
    )
    assert repo_layer_ids(config.model) == list(range(3, 16))
    config.save(tmp_path / "config.yaml")
    assert RepoTrainConfig.load(tmp_path / "config.yaml", validate_paths=False) == config
    assert RepoModelConfig.load(tmp_path / "config.yaml", key="model", validate_paths=False) == config.model


BAD = [
    (["model.pe_mode=cope"], "model.pe_mode='cope'", "allowed: rope, nope, repo"),
    (["model.foo=1"], "model.foo", "not in 'RepoModelConfig'"),
    (["model.pe_mode=repo", "model.pe_start_layer=16"], "model.pe_start_layer=16", "allowed 0..15"),
    (["model.pe_mode=repo", "model.pe_start_layer=-1"], "model.pe_start_layer=-1", "allowed 0..15"),
    (["model.pe_mode=nope", "model.pe_layer_ids=[3,16]"], "model.pe_layer_ids", "allowed 0..15"),
    (["model.pe_mode=nope", "model.pe_layer_ids=[3,3]"], "model.pe_layer_ids", "repeats"),
    (
        ["model.pe_mode=repo", "model.pe_start_layer=5", "model.pe_layer_ids=[1,2]"],
        "model.pe_mode=repo",
        "selects no layer",
    ),
    (["model.pe_mode=repo", "model.rope=false"], "model.rope", "allowed: rope: true"),
    (["model.pe_mode=nope", "model.rope=false"], "model.rope", "allowed: rope: true"),
    (["model.pe_mode=repo", "model.n_kv_heads=3"], "model.n_kv_heads=3", "does not divide model.n_heads=16"),
    (["model.pe_mode=repo", "model.block_type=llama"], "model.block_type", "allowed: sequential"),
]


@pytest.mark.parametrize("overrides, key, allowed", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_values_fail_at_load_naming_key_and_allowed_values(overrides, key, allowed):
    with pytest.raises(OLMoConfigurationError) as error:
        RepoTrainConfig.load(CONFIGS / "baseline-1B-rope.yaml", overrides, validate_paths=False)
    assert key in str(error.value) and allowed in str(error.value)


def test_reference_and_new_keys_cannot_be_mixed(tmp_path):
    path = tmp_path / "c.yaml"
    om.save(
        om.create({"model": {"n_layers": 4, "rope": True, "pe_mode": "repo", "dynamic_pe_start_layer": 2}}),
        path,
    )
    with pytest.raises(OLMoConfigurationError, match="dynamic_pe_start_layer and model.pe_mode"):
        RepoTrainConfig.load(path)
    om.save(om.create({"model": {"n_layers": 4, "rope": True, "dynamic_pe_mode": "cope"}}), path)
    with pytest.raises(OLMoConfigurationError, match="dynamic_pe_mode='cope' is not supported"):
        RepoTrainConfig.load(path)
