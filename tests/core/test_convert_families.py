"""Stock Hugging Face Llama and Qwen 3 <-> OLMo-core checkpoints (`olmo_repo.olmocore.hf`): the weights through
OLMo-core's own state converters, the configs through this project's family tables; the same model everywhere."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import olmo_repo.hf  # noqa: F401  (registers repo_llama and repo_qwen3 with the Auto classes)
from olmo_repo.cli import core_convert_from_hf, core_convert_to_hf
from olmo_repo.errors import RepoError
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.fit import f_phi_layer
from olmo_repo.hf import read_hf_config
from olmo_repo.hf.formats import ALL_MODEL_TYPES
from olmo_repo.modes import F_PHI_WEIGHTS
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.attention import RepoAttention, with_position_modes
from olmo_repo.olmocore.convert import core_config_from_hf
from olmo_repo.olmocore.families import FAMILIES
from olmo_repo.olmocore.hf import core_to_hf, hf_to_core
from olmo_repo.olmocore.stage1 import check_stage1
from olmo_repo.rope import record_positions

from ..round_trips import HF_MAY_DIFFER, config_differences
from .tiny import assert_within, logit_roundings

VOCAB = 4096  # the demo tokenizer's (tokenizer.json carried along)
TOKENIZER = {
    "identifier": str(BASE_DIR / "tokenizer.json"),
    "vocab_size": VOCAB,
    "eos_token_id": 0,
    "pad_token_id": 1,
}
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "olmocore"
SIZES = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    eos_token_id=0, pad_token_id=1, bos_token_id=None, max_position_embeddings=256,
)  # fmt: skip

CASES = {
    # GQA, untied, Llama 3's RoPE scaling over an original length short enough to scale some test frequencies;
    # several end ids, as Llama 3 Instruct lists them
    "llama-gqa-llama3": (
        LlamaConfig,
        dict(
            num_key_value_heads=2,
            eos_token_id=[0, 2],
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        torch.float32,
    ),
    # SmolLM2-135M's shape in 2 layers (9 heads, 3 KV heads, head_dim 64, theta 1e5, tied, bf16 and extra keys as
    # published)
    "smollm2-shape": (
        LlamaConfig,
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=2,
            num_attention_heads=9,
            num_key_value_heads=3,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            initializer_range=0.041666666666666664,
            max_position_embeddings=8192,
            is_llama_config=True,  # keys of the published config.json that LlamaConfig does not define
            rope_interleaved=False,
        ),
        torch.bfloat16,
    ),
    # MQA, head_dim 24 != 64 / 4, untied, linear RoPE scaling, max_window_layers as Qwen3-8B's config.json states
    # it (28 of its 36 layers; no layer slides: transformers reads it only where layer_types is unset)
    "qwen3-mqa-head-dim": (
        Qwen3Config,
        dict(
            num_key_value_heads=1,
            head_dim=24,
            max_window_layers=28,
            rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
        ),
        torch.float32,
    ),
    # GQA, tied, attention biases, sliding windows of 5 in layers 2-3 (shorter than the test sequence)
    "qwen3-gqa-bias-windows": (
        Qwen3Config,
        dict(
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
            attention_bias=True,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=2,
        ),
        torch.float32,
    ),
}


def _stock(tmp_path, case: str):
    """A random stock model of `case` saved with save_pretrained and the demo's tokenizer.json; norms and biases
    random too (HF inits them to 1 and 0: a swapped norm or a dropped bias would pass unseen), q and k large."""
    config_class, extra, dtype = CASES[case]
    config = config_class(**{**SIZES, **extra})
    torch.manual_seed(0)
    model = (LlamaForCausalLM if config_class is LlamaConfig else Qwen3ForCausalLM)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(2.0, 4.0)  # Qwen 3 normalises q and k per head: sharp attention comes from these
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)  # sharp attention: logits depend on positions (RoPE, its scaling, windows)
    out = tmp_path / "stock"
    model.to(dtype).save_pretrained(out)
    shutil.copyfile(BASE_DIR / "tokenizer.json", out / "tokenizer.json")
    return model.eval(), out


def _states(hf_dir) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype="auto")
    return dict(model.state_dict())


def _fp32(core_dir):
    """The converted checkpoint as an fp32 OLMo-core model (torch.distributed.checkpoint upcasts exactly)."""
    fp32 = core_config_from_hf(read_hf_config(core_dir.parent / "stock", ALL_MODEL_TYPES))
    return checkpoint.load_model(core_dir, fp32).eval(), fp32


def _json(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("case", CASES)
def test_stock_model_round_trips_bit_exact_and_matches_hf(tmp_path, case):
    """HF -> OLMo-core: the stock weights and nothing else (no f_phi), the tokenizer beside; OLMo-core's logits
    equal transformers' in fp32 within the rounding bound; -> HF again: every tensor bit-exact, dtype kept, and
    config.json whole."""
    stock, hf_dir = _stock(tmp_path, case)
    core_dir = hf_to_core(hf_dir, tmp_path / "core")
    saved = checkpoint.read_config(core_dir)
    assert (core_dir / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    assert saved["train_module"]["max_sequence_length"] == stock.config.max_position_embeddings
    config = checkpoint.model_config(core_dir)
    assert config.block.name == "default"
    core_state = checkpoint.state_dict(checkpoint.load_model(core_dir))
    assert not [k for k in core_state if f_phi_layer(k) is not None]

    model, fp32 = _fp32(core_dir)
    ids = torch.randint(2, VOCAB, (2, 24))
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()  # fp32 copies, fp32 RoPE
    with torch.no_grad():
        truth = hf(ids).logits
        assert_within(model(ids), truth, roundings=2 * logit_roundings(fp32, 24), what="logits")

    back = core_to_hf(core_dir, tmp_path / "hf")
    assert not (back / "rope.py").exists()  # a stock model: no remote code
    first, again = _states(hf_dir), _states(back)
    assert first.keys() == again.keys()
    for name, tensor in first.items():
        assert again[name].dtype == tensor.dtype == CASES[case][2] and torch.equal(again[name], tensor), name
    assert config_differences(_json(hf_dir / "config.json"), _json(back / "config.json"), HF_MAY_DIFFER) == {}


@pytest.mark.parametrize("case", ["llama-gqa-llama3", "qwen3-mqa-head-dim"])
def test_a_repo_config_starts_from_the_converted_stock_model(tmp_path, case):
    """The stage-1 start: a RePo config (layers 1-3) fits the converted stock checkpoint by the fit rule with
    exactly the f_phi weights new; they keep their init, every base tensor loads bit-exact."""
    _, hf_dir = _stock(tmp_path, case)
    core_dir = hf_to_core(hf_dir, tmp_path / "core")
    stock_state = checkpoint.state_dict(checkpoint.load_model(core_dir))
    repo = with_position_modes(checkpoint.model_config(core_dir), "repo", pe_start_layer=1)
    check_stage1(str(core_dir), repo)
    model = repo.build(init_device="cpu")
    model.init_weights(max_seq_len=64)
    init = {k: v.clone() for k, v in checkpoint.state_dict(model).items()}
    result = model.load_state_dict(stock_state, strict=False)
    new = {f"blocks.{i}.attention.{name}.weight" for i in (1, 2, 3) for name in F_PHI_WEIGHTS}
    assert set(result.missing_keys) == new and not result.unexpected_keys
    for name, tensor in checkpoint.state_dict(model).items():
        assert torch.equal(tensor, init[name] if name in new else stock_state[name]), name
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(2, VOCAB, (1, 16)))).all()


def _run_model(name: str):
    """The stage-1 model of a configs/olmocore file (OLMo-core's own norms and RoPE precision, as a run has them)."""
    spec = importlib.util.spec_from_file_location(name, CONFIGS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.model()


@pytest.mark.parametrize(
    "case", ["llama-gqa-llama3", "qwen3-gqa-bias-windows", "tiny-llama3-repo.py", "tiny-qwen3-repo.py"]
)
def test_repo_models_convert_to_repo_llama_and_repo_qwen3(tmp_path, case):
    """An OLMo-core RePo model of the family (f_phi reading the normed hidden state of the pre-norm block; from a
    converted HF model's config or a configs/olmocore run's) -> `repo_llama` / `repo_qwen3` with remote code:
    HF's logits and positions equal OLMo-core's in fp32; back to OLMo-core every tensor bit-exact, f_phi
    carried."""
    if case.endswith(".py"):
        stock = _run_model(case)
        saved = {"dataset": {"tokenizer": TOKENIZER}, "train_module": {"max_sequence_length": 64}}
    else:
        _, hf_dir = _stock(tmp_path, case)
        stock = core_config_from_hf(read_hf_config(hf_dir, ALL_MODEL_TYPES))
        saved = checkpoint.read_config(hf_to_core(hf_dir, tmp_path / "tokenized"))
    config = with_position_modes(stock, "repo", pe_start_layer=1)
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=64)
    with torch.no_grad():
        for block in model.blocks.values():
            if isinstance(block.attention, RepoAttention) and block.attention.pe_mode == "repo":
                block.attention.final_map.weight.mul_(3000.0)
    core_dir = tmp_path / "core"
    core_dir.mkdir()
    checkpoint.save_model(model, {**saved, "model": config.as_config_dict()}, core_dir)

    out = core_to_hf(core_dir, tmp_path / "hf")
    family = "repo_llama" if "llama" in case else "repo_qwen3"
    assert _json(out / "config.json")["model_type"] == family and (out / f"modeling_{family}.py").is_file()
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    ids = torch.randint(2, VOCAB, (2, 24))
    with torch.no_grad(), record_positions(model) as positions:
        logits = model.eval()(ids)
    with torch.no_grad():
        result = hf(ids, output_positions=True)
    roundings = 2 * logit_roundings(config, 24)
    assert_within(result.logits, logits, roundings=roundings, what="logits")
    assert sorted(result.positions) == sorted(positions) == [1, 2, 3]
    for layer, z in positions.items():
        assert z.abs().max() > 1.0
        assert_within(result.positions[layer], z, roundings=roundings, what=f"positions of layer {layer}")
    again = checkpoint.state_dict(checkpoint.load_model(hf_to_core(out, tmp_path / "back")))
    for name, tensor in checkpoint.state_dict(model).items():
        assert torch.equal(again[name], tensor), name


def test_the_scripts_convert_both_ways_and_refuse_in_one_line(tmp_path, capsys):
    """scripts/core_convert_from_hf.py and core_convert_to_hf.py (their `main`): a stock Qwen 3 there and back;
    an HF model OLMo-core cannot express (mlp_bias) is one line naming the key, exit 1, nothing written."""
    _, hf_dir = _stock(tmp_path, "qwen3-mqa-head-dim")
    core_dir, back = tmp_path / "core", tmp_path / "hf"
    assert core_convert_from_hf.main(["--input", str(hf_dir), "--output", str(core_dir)]) == 0
    assert core_convert_to_hf.main(["--input", str(core_dir), "--output", str(back)]) == 0
    assert _json(back / "config.json")["model_type"] == "qwen3"
    bad = tmp_path / "bad"
    LlamaForCausalLM(LlamaConfig(**{**SIZES, "vocab_size": 128, "mlp_bias": True})).save_pretrained(bad)
    capsys.readouterr()
    assert core_convert_from_hf.main(["--input", str(bad), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mlp_bias=True" in err, err
    assert not (tmp_path / "out").exists()


def _bad_llama(tmp_path, **extra):
    config = LlamaConfig(**{**SIZES, "vocab_size": 128, **extra})
    LlamaForCausalLM(config).save_pretrained(tmp_path / "bad")
    return tmp_path / "bad"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' has no OLMo-core counterpart; allowed: 'silu'"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
            r"rope_parameters.rope_type='dynamic' has no OLMo-core counterpart",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 5e5,
                    "factor": 8.0,
                    "low_freq_factor": 3.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            },
            r"rope_parameters.low_freq_factor=3.0 is not stated exactly",
        ),
        (
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "mscale": 1.0}},
            r"rope_parameters.mscale has no counterpart",
        ),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4 + 0.5}}, r"rope_theta=10000.5"),
        ({"attention_dropout": 0.1}, r"attention_dropout=0.1"),
    ],
)
def test_bad_hf_configs_are_refused_in_one_line_naming_the_key(tmp_path, extra, message):
    bad = _bad_llama(tmp_path, **extra)
    with pytest.raises(RepoError, match=message) as error:
        hf_to_core(bad, tmp_path / "out")
    assert len(str(error.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_weights_that_do_not_fit_the_config_are_refused_in_one_line(tmp_path):
    """A config.json whose vocab_size is not the embeddings' (OLMo-core pads nothing: shapes must fit)."""
    bad = _bad_llama(tmp_path)
    config = _json(bad / "config.json")
    (bad / "config.json").write_text(json.dumps({**config, "vocab_size": 160}))
    with pytest.raises(
        RepoError,
        match=r"the weights do not fit the OLMo-core model: embeddings.weight \(128, 64\) \(config.json: \(160, 64\)\)",
    ):
        hf_to_core(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_olmo_core_model_of_no_hf_shape_is_refused_naming_the_key(tmp_path):
    """OLMo-core -> HF: a Llama-shaped model with sliding windows (Llama has none) or a feed-forward bias."""
    _, hf_dir = _stock(tmp_path, "llama-gqa-llama3")
    core_dir = hf_to_core(hf_dir, tmp_path / "core")
    for key, change in (
        ("block.sequence_mixer.sliding_window", "sliding"),
        ("block.feed_forward.bias", "bias"),
    ):
        saved = checkpoint.read_config(core_dir)
        config = checkpoint.model_config(core_dir)
        if change == "sliding":
            from olmo_core.nn.attention import SlidingWindowAttentionConfig

            config.block.sequence_mixer.sliding_window = SlidingWindowAttentionConfig(
                pattern=[8], force_full_attention_on_first_layer=False
            )
        else:
            config.block.feed_forward.bias = True
        changed = tmp_path / change
        changed.mkdir()
        (changed / "model_and_optim").symlink_to(core_dir / "model_and_optim")
        (changed / "config.json").write_text(json.dumps({**saved, "model": config.as_config_dict()}))
        with pytest.raises(RepoError, match=rf"model.{key}=.*not the Llama or Qwen 3 shape"):
            core_to_hf(changed, tmp_path / "out")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.stock.model_type)
def test_each_family_table_covers_every_key_of_its_hf_config(family):
    """Every key transformers' config class adds to PreTrainedConfig is a table row, a fixed value or a key with
    a reason to live elsewhere: a key added by a new transformers fails here, not silently in a conversion."""
    base = {f.name for f in dataclasses.fields(PreTrainedConfig)}
    keys = {f.name for f in dataclasses.fields(family.stock)} - base
    covered = {k for row in family.rows for k in row.hf} | set(family.hf_fixed) | set(family.hf_free)
    assert keys - covered == set() and covered - keys == set()


def test_conversions_say_only_what_the_user_must_know(tmp_path, capfd, recwarn, caplog):
    """Both ways, nothing but the line a user needs: no warning of torch's that a checkpoint is read or written in
    one process (each conversion printed one or two), none of transformers' that a Llama 3 scaling's original length
    is past the context of a run trained shorter (the config it warned of was built at the training length, then
    given the stock model's), and one line where the HF directory has no tokenizer.json."""
    _, hf_dir = _stock(tmp_path, "llama-gqa-llama3")  # original_max_position_embeddings 32, context 256
    (hf_dir / "tokenizer.json").unlink()
    core_dir = hf_to_core(hf_dir, tmp_path / "core")
    config = checkpoint.read_config(core_dir)
    config["train_module"]["max_sequence_length"] = 16  # a run trained at 16 tokens
    (core_dir / "config.json").write_text(json.dumps(config))
    transformers_log = logging.getLogger("transformers")  # its own handler, not propagated: caplog's added
    transformers_log.addHandler(caplog.handler)
    try:
        back = core_to_hf(core_dir, tmp_path / "hf", tokenizer=str(BASE_DIR / "tokenizer.json"))
    finally:
        transformers_log.removeHandler(caplog.handler)
    assert _json(back / "config.json")["max_position_embeddings"] == 256
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    out, err = capfd.readouterr()
    assert [line for line in err.splitlines() if line.strip() and "%|" not in line] == [
        f"{hf_dir} has no tokenizer.json: the checkpoint records no tokenizer (a run's config names its data's; "
        "converting it back to HF then takes --tokenizer)"
    ]
    assert [str(w.message) for w in recwarn] == []
