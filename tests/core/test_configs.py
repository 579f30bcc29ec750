"""The OLMo-core configs (configs/olmocore/): each builds, names its source, and says what it says."""

from __future__ import annotations

import argparse

import pytest
import yaml
from olmo_core.nn.transformer import TransformerConfig

from olmo_repo.data.tokens import TOKENS_FILE
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.hf import read_hf_config
from olmo_repo.modes import repo_layer_ids
from olmo_repo.olmocore.attention import RepoAttention
from olmo_repo.olmocore.convert import core_config_from_hf
from olmo_repo.olmocore.train import load_build_config

from .training import ROOT

CONFIGS = ROOT / "configs" / "olmocore"


def _build(name: str, tmp_path, data_root: str = "https://olmo-data.org"):
    opts = argparse.Namespace(
        name="t", sequence_length=None, data_root=data_root, save_folder=str(tmp_path), work_dir=str(tmp_path)
    )
    return load_build_config(CONFIGS / name)(opts, [])


def _repo_layers(config: TransformerConfig) -> list[int]:
    return repo_layer_ids(config.block.sequence_mixer, n_layers=config.n_layers)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.py")))
def test_every_config_names_its_source_and_builds(name, tmp_path):
    assert "Source:" in (CONFIGS / name).read_text().split('"""')[1]
    _build(name, tmp_path).model.build(init_device="meta")


def test_olmo3_7b_midtraining_is_the_official_recipe_with_repo(tmp_path):
    config = _build("OLMo-3-1025-7B-midtrain-repo.py", tmp_path)
    assert _repo_layers(config.model) == list(range(10, 32))
    stock = TransformerConfig.olmo3_7B(vocab_size=100352).build(init_device="meta")
    model = config.model.build(init_device="meta")
    windows = [b.attention.window_size for b in model.blocks.values()]
    assert windows == [b.attention.window_size for b in stock.blocks.values()] and 4096 in windows
    assert sum(isinstance(b.attention, RepoAttention) for b in model.blocks.values()) == 22
    assert config.load_path.endswith("Olmo-3-1025-7B/stage1/step1413814/")
    assert config.data_loader.global_batch_size == 2**21 and config.dataset.sequence_length == 8192
    assert config.trainer.max_duration.value == 100_000_000_000


def test_olmo2_1b_stage2_is_the_released_recipe_for_olmo_core(tmp_path):
    released = yaml.safe_load((ROOT / "configs" / "released" / "OLMo2-1B-stage2-seed42.yaml").read_text())
    config = _build("OLMo-2-0425-1B-stage2-repo.py", tmp_path, data_root="/data/olmo-data")
    assert _repo_layers(config.model) == list(range(5, 16))
    assert config.model.d_model == released["model"]["d_model"] and config.model.n_layers == 16
    assert config.dataset.paths == [
        p.replace("http://olmo-data.org", "/data/olmo-data") for p in released["data"]["paths"]
    ]
    tm = config.train_module
    assert tm.optim.lr == released["optimizer"]["learning_rate"]
    assert tm.rank_microbatch_size == released["device_train_microbatch_size"] * 4096
    assert config.data_loader.global_batch_size == released["global_train_batch_size"] * 4096
    assert config.trainer.hard_stop.value == released["stop_at"] and config.init_seed == released["seed"]


def test_tiny_config_is_the_demo_base_model_with_repo(tmp_path):
    config = _build("tiny-stage2-repo.py", tmp_path, data_root=str(tmp_path))
    base = core_config_from_hf(read_hf_config(BASE_DIR))
    assert (
        config.model.build(init_device="meta").state_dict().keys()
        >= base.build(init_device="meta").state_dict().keys()
    )
    assert _repo_layers(config.model) == [1, 2, 3]
    shapes = {k: v.shape for k, v in base.build(init_device="meta").state_dict().items()}
    assert {
        k: v.shape for k, v in config.model.build(init_device="meta").state_dict().items() if k in shapes
    } == shapes


# The published parameter counts of the stock models (their model cards: Llama 3.2 1B 1.24B with tied
# embeddings, 1,235,814,400; Qwen3-0.6B-Base 0.6B of which 0.44B non-embedding, 596,049,920).
FAMILY_CONFIGS = {
    "Llama-3.2-1B-repo.py": ("llama", 1_235_814_400, list(range(5, 16))),
    "Qwen3-0.6B-Base-repo.py": ("qwen3", 596_049_920, list(range(9, 28))),
}


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_family_configs_are_the_published_model_with_repo_on_the_olmo2_1b_recipe(name, tmp_path):
    import json

    from olmo_repo.olmocore import with_position_modes
    from olmo_repo.olmocore.train import load_build_config as load

    model_type, parameters, layers = FAMILY_CONFIGS[name]
    config = _build(name, tmp_path, data_root="/data/tokens")
    assert _repo_layers(config.model) == layers
    stock = with_position_modes(config.model, "rope")
    assert sum(p.numel() for p in stock.build(init_device="meta").parameters()) == parameters

    # The model the converter makes of a checkpoint with this config.json (the stage-1 `load_path`), with RePo.
    module = load(CONFIGS / name).__globals__
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(
        json.dumps({"model_type": model_type, **module["HF_CONFIG"]})
    )
    converted = core_config_from_hf(read_hf_config(tmp_path / "hf", model_types=(model_type,)))
    assert (
        config.model.as_config_dict()
        == with_position_modes(converted, "repo", pe_start_layer=layers[0]).as_config_dict()
    )

    # The data is the model's tokenizer's, under --data-root; everything else is the OLMo 2 1B recipe's.
    assert config.dataset.tokenizer.vocab_size == config.model.vocab_size
    assert config.dataset.paths == [f"/data/tokens/{TOKENS_FILE}"]  # what scripts/tokenize_text.py writes
    assert config.trainer.callbacks["niah"].tokenizer == config.dataset.tokenizer
    recipe = _build("OLMo-2-0425-1B-stage2-repo.py", tmp_path, data_root="/data/tokens")
    for part in ("train_module", "data_loader"):
        assert getattr(config, part).as_config_dict() == getattr(recipe, part).as_config_dict(), part
    assert config.trainer.hard_stop == recipe.trainer.hard_stop and config.init_seed == recipe.init_seed
