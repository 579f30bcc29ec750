"""A model continued from a stock Hugging Face model converts back with what the stock model was (issue 51), for
every family OLMo-core trains (OLMo 2, OLMo 3, Llama 3, Qwen 3, SmolLM2 as a Llama; ai2-olmo's OLMo 2:
tests/test_continued_models.py): its context length and RoPE scaling (a run's window is what it trained on, not
what the model reads), its token ids and every other key of its config, the run's RePo keys over them. A stock
model that reads longer than the run's window, converted to a stage-1 checkpoint, and a run's checkpoint of it as
the Trainer saves one (its config.json carrying the stock config: the real Trainer's in the last test), converted
back: evaluated past the run's window, a RoPE run is the stock model, without YaRN stacked on it."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, Olmo2Config, Olmo2ForCausalLM, Olmo3Config, Olmo3ForCausalLM

from olmo_repo.eval.loading import load_model, yarn_overrides
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.modes import SCORED_PE_KEYS
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.attention import with_position_modes
from olmo_repo.olmocore.hf import HF_CONFIG, core_to_hf, hf_to_core, recorded_stock

from ..round_trips import HF_MAY_DIFFER, config_differences
from .test_convert_families import SIZES, _stock
from .training import TINY, random_corpus

WINDOW, PAST = 64, 200  # the run's training length; a length past it, within every stock model's
RUN_KEYS = {k: "the run's RePo model" for k in ("model_type", "architectures", "auto_map", *SCORED_PE_KEYS)}


def _stock_olmo(tmp_path, family: str):
    """A random stock `olmo2` or `olmo3` (sliding windows of 8 in three of four layers) of SIZES' length."""
    sizes = {**SIZES, "eos_token_id": 0, "pad_token_id": 1}
    if family == "olmo2":
        config, model_class = Olmo2Config(**sizes), Olmo2ForCausalLM
    else:
        kinds = ["sliding_attention"] * 3 + ["full_attention"]
        config, model_class = Olmo3Config(**sizes, sliding_window=8, layer_types=kinds), Olmo3ForCausalLM
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)  # sharp attention: logits depend on the positions
    out = tmp_path / "stock"
    model.save_pretrained(out)
    shutil.copyfile(BASE_DIR / "tokenizer.json", out / "tokenizer.json")
    return out


def _run_checkpoint(stage1, out, mode: str):
    """What a run continuing `stage1` saves at its start (`olmocore.train.build_trainer`'s config.json): the model
    with `mode` from layer 1, the run's window, its data's tokenizer (one end id, no start id) and the stock
    config it carries."""
    config = checkpoint.read_config(stage1)
    model_config = checkpoint.model_config(stage1)
    model = checkpoint.load_model(stage1, model_config)
    if mode == "repo":
        model_config = with_position_modes(model_config, "repo", pe_start_layer=1)
        repo = model_config.build(init_device="cpu")
        repo.load_state_dict(model.state_dict(), strict=False)  # f_phi as initialised, the rest the stock's
        model = repo
    tokenizer = {**config["dataset"]["tokenizer"], "eos_token_id": 0, "bos_token_id": None}
    saved = {"model": model_config.as_config_dict(), "dataset": {"tokenizer": tokenizer},
             "train_module": {"max_sequence_length": WINDOW}, HF_CONFIG: recorded_stock(stage1)}  # fmt: skip
    checkpoint.save_model(model, saved, out)
    return out


@pytest.mark.slow  # 2-4 s a family
@pytest.mark.parametrize(
    "family", ["olmo2", "olmo3", "llama-gqa-llama3", "qwen3-gqa-bias-windows", "smollm2-shape"]
)
def test_a_run_of_a_stock_model_converts_back_with_its_config(tmp_path, family):
    stock = _stock_olmo(tmp_path, family) if family.startswith("olmo") else _stock(tmp_path, family)[1]
    stock_json = json.loads((stock / "config.json").read_text())
    assert stock_json["max_position_embeddings"] > PAST > WINDOW
    stage1 = hf_to_core(stock, tmp_path / "stage1")
    for mode in ("rope", "repo"):
        run = _run_checkpoint(stage1, tmp_path / f"run-{mode}", mode)
        out = core_to_hf(run, tmp_path / f"hf-{mode}")
        out_json = json.loads((out / "config.json").read_text())
        # the stock config whole (length, RoPE scaling, every end id, extra keys), the run's RePo keys over it
        may_differ = {**HF_MAY_DIFFER, **(RUN_KEYS if mode == "repo" else {})}
        assert config_differences(stock_json, out_json, may_differ) == {}, mode
        hf = load_model(out, PAST)
        assert yarn_overrides(hf.config, PAST) == {}  # within the stock model's context: as it is
        if mode == "repo":
            assert (out_json["pe_mode"], out_json["pe_start_layer"]) == ("repo", 1)
            continue
        ids = torch.randint(2, SIZES["vocab_size"], (1, PAST), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected = AutoModelForCausalLM.from_pretrained(stock, dtype=torch.float32).eval()(ids).logits
            assert torch.equal(hf(ids).logits, expected)  # the stock model's behaviour past the run's window


def test_a_model_trained_from_scratch_keeps_its_training_length(tmp_path):
    """No stock config: its training length is the one evaluation extends the context from."""
    stage1 = hf_to_core(_stock_olmo(tmp_path, "olmo2"), tmp_path / "stage1")
    run = _run_checkpoint(stage1, tmp_path / "run", "rope")
    config = checkpoint.read_config(run)
    del config[HF_CONFIG]
    (run / checkpoint.CONFIG).write_text(json.dumps(config))
    out = core_to_hf(run, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == WINDOW


@pytest.mark.slow
def test_the_trainer_carries_the_stock_config_into_its_checkpoints(tmp_path):
    """The real Trainer (one gloo process) on the tiny config's 64-token windows from the demo's stock base model
    (it reads 512): the checkpoint it saves converts back with the base model's length and config."""
    import olmo_core.distributed.parallel as parallel
    from olmo_core.distributed.utils import init_distributed

    from olmo_repo.olmocore.train import build_trainer, load_build_config, start

    data = random_corpus(tmp_path / "data")
    stage1 = hf_to_core(BASE_DIR, tmp_path / "base")
    save = tmp_path / "run"
    opts = argparse.Namespace(config=str(TINY), name="test", sequence_length=WINDOW, data_root=str(data),
                              save_folder=str(save), work_dir=str(save), dry_run=False)  # fmt: skip
    experiment = load_build_config(TINY)(
        opts, ["--trainer.callbacks.niah.enabled=false", f"--load_path={stage1}"]
    )
    own_group = not torch.distributed.is_initialized()
    init_distributed(backend="gloo")
    parallel._WORLD_MESH = None  # OLMo-core builds one device mesh per process; tests build several
    try:
        trainer = build_trainer(experiment)
        start(trainer, experiment)
        step0 = trainer.save_checkpoint()
    finally:
        if own_group:
            torch.distributed.destroy_process_group()
    assert checkpoint.read_config(step0)["train_module"]["max_sequence_length"] == WINDOW
    out = core_to_hf(step0, tmp_path / "hf")
    base_json, out_json = (json.loads((d / "config.json").read_text()) for d in (BASE_DIR, out))
    assert (
        config_differences(base_json, out_json, {**HF_MAY_DIFFER, **RUN_KEYS, "dtype": "trained in fp32"})
        == {}
    )
