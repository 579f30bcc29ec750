"""A model continued from a stock Hugging Face model converts back with what the stock model was (issue 51), on the
ai2-olmo side (OLMo 2; OLMo-core's families: tests/core/test_continued_models.py): a stock Olmo2 that reads 256
tokens, converted to a stage-1 checkpoint, continued by the real Trainer on 32-token windows and saved, converts
to HF with the stock model's length and every key of its config, the run's RePo keys over them; evaluated past
the run's window (96 tokens) a RoPE run is the stock model, without the YaRN a 32-token config would stack on it."""

from __future__ import annotations

import json

import pytest
import torch
from olmo.config import CheckpointType
from transformers import AutoModelForCausalLM, Olmo2ForCausalLM

from olmo_repo import RepoTrainConfig
from olmo_repo.ai2olmo.convert import hf_config_from_olmo
from olmo_repo.ai2olmo.hf import convert_from_hf, convert_to_hf
from olmo_repo.eval.loading import load_model, yarn_overrides
from olmo_repo.modes import SCORED_PE_KEYS

from .round_trips import HF_MAY_DIFFER, config_differences
from .training import STAGE1, STAGE2_REPO, make_trainer, small, write_corpus

pytestmark = pytest.mark.slow  # two runs started by the Trainer

CONTEXT, WINDOW, PAST = 256, 32, 96  # the stock model's length, the run's, a length past the run's


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """The runs' data, and a stock HF Olmo2 of the tiny config's model that reads CONTEXT tokens, with a key of
    its config.json that no class defines."""
    root = tmp_path_factory.mktemp("stock")
    data = write_corpus(root / "data")
    model_config = RepoTrainConfig.load(STAGE1, small(data, root / "x")).model
    config = hf_config_from_olmo(model_config)
    config.max_position_embeddings = CONTEXT
    config.stock_only_key = "kept"
    torch.manual_seed(0)
    Olmo2ForCausalLM(config).save_pretrained(root / "hf")
    (root / "hf" / "tokenizer.json").write_bytes((data / "tokenizer.json").read_bytes())
    return data, root / "hf", convert_from_hf(root / "hf", root / "stage1")


@pytest.mark.parametrize("config", [STAGE1, STAGE2_REPO], ids=["rope", "repo"])
def test_a_run_of_a_stock_model_converts_back_with_its_config(stock, tmp_path, device, config):
    data, hf, stage1 = stock
    overrides = small(data, tmp_path / "run", load_path=stage1, reset_optimizer_state="true")
    with make_trainer(config, overrides, device) as trainer:
        assert trainer.cfg.model.max_sequence_length == WINDOW
        checkpoint, _ = trainer.save_checkpoint(checkpoint_type=CheckpointType.unsharded)
    out = convert_to_hf(checkpoint, tmp_path / "hf")
    stock_json, out_json = (json.loads((d / "config.json").read_text()) for d in (hf, out))
    assert out_json["max_position_embeddings"] == CONTEXT and out_json["stock_only_key"] == "kept"
    run_keys = {"model_type", "architectures", "auto_map", *SCORED_PE_KEYS} if config == STAGE2_REPO else {}
    assert (
        config_differences(stock_json, out_json, {**HF_MAY_DIFFER, **dict.fromkeys(run_keys, "the run's")})
        == {}
    )
    assert yarn_overrides(load_model(out, PAST).config, PAST) == {}  # within the stock context: no YaRN
    if config == STAGE2_REPO:
        assert (out_json["model_type"], out_json["pe_mode"], out_json["pe_start_layer"]) == (
            "repo_olmo2",
            "repo",
            1,
        )
        return
    ids = torch.randint(2, 128, (1, PAST))
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(hf).eval()(ids).logits
        assert torch.equal(load_model(out, PAST)(ids).logits, expected)  # the stock model's behaviour


def test_a_checkpoints_damaged_config_is_one_line_naming_it_and_none_records_nothing(tmp_path):
    """`recorded_stock` on a local checkpoint (the remote one: tests/test_train_cli.py's S3 test): a config.yaml
    that is not YAML, or YAML but not a mapping, is one line naming the file; no config.yaml records nothing."""
    from olmo_repo.ai2olmo.hf import recorded_stock
    from olmo_repo.errors import CorruptFileError

    assert recorded_stock(tmp_path) is None
    for text, says in [
        (b"{not: yaml", "is not valid YAML (while parsing a flow mapping)"),
        (b"\xff\xfe garbage", "is not valid YAML ('utf-8' codec can't decode byte 0xff"),
        (b"- a\n- b\n", "is not a checkpoint's config (a YAML mapping): a ListConfig"),
    ]:
        (tmp_path / "config.yaml").write_bytes(text)
        with pytest.raises(CorruptFileError) as raised:
            recorded_stock(tmp_path)
        assert str(raised.value).startswith(f"{tmp_path}/config.yaml {says}"), raised.value
