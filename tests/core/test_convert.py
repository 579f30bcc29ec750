"""OLMo-core checkpoints <-> Hugging Face (`olmo_repo.olmocore.hf`): the same model everywhere."""

from __future__ import annotations

import json

import pytest
import torch
from olmo_core.nn.attention import SlidingWindowAttentionConfig
from olmo_core.nn.rope import StepwiseRoPEScalingConfig
from transformers import AutoModelForCausalLM, Olmo2Config, Olmo2ForCausalLM

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2 with the Auto classes)
from olmo_repo.errors import RepoError
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.hf import read_hf_config
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.attention import RepoAttention
from olmo_repo.olmocore.convert import core_config_from_hf
from olmo_repo.olmocore.hf import core_to_hf, hf_to_core
from olmo_repo.rope import record_positions

from ..round_trips import ALL_ROPE_MAY_DIFFER, CORE_MAY_DIFFER, HF_MAY_DIFFER, config_differences
from .tiny import assert_within, logit_roundings, olmo2_tiny

TOKENIZER = {
    "identifier": str(BASE_DIR / "tokenizer.json"),
    "vocab_size": 4096,
    "eos_token_id": 0,
    "pad_token_id": 1,
    "bos_token_id": None,
}


def _save_core(tmp_path, config, spread: float = 3000.0, length: int | None = 64):
    """A model-only checkpoint of `config` with RePo's f_phi spread wide; `length`: the training length it
    records as a run does (none: not recorded)."""
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=64)
    with torch.no_grad():
        for block in model.blocks.values():
            if isinstance(block.attention, RepoAttention) and block.attention.pe_mode == "repo":
                block.attention.final_map.weight.mul_(spread)
    out = tmp_path / "core"
    out.mkdir()
    saved = {"model": config.as_config_dict(), "dataset": {"tokenizer": TOKENIZER}}
    if length is not None:
        saved["train_module"] = {"max_sequence_length": length}
    checkpoint.save_model(model, saved, out)
    return model.eval(), out


def _assert_same_model(hf, model, config, kv_heads: int | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """HF's logits and positions (RePo layers 1-3) equal OLMo-core's in fp32 on random ids [2, 24]; returns the
    ids, HF's logits and the rounding count of the bound."""
    ids = torch.randint(2, 4096, (2, 24))
    with torch.no_grad(), record_positions(model) as positions:
        logits = model(ids)
    with torch.no_grad():
        out = hf(ids, output_positions=True)
    roundings = 2 * logit_roundings(config, 24)
    assert_within(out.logits, logits, roundings=roundings, what="logits")
    assert sorted(out.positions) == sorted(positions) == [1, 2, 3]
    for layer, z in positions.items():
        assert z.shape == (2, kv_heads or 4, 24) and z.abs().max() > 1.0
        assert_within(out.positions[layer], z, roundings=roundings, what=f"positions of layer {layer}")
    return ids, out.logits, roundings


def _assert_round_trip(hf_dir, model, tmp_path) -> None:
    """The HF directory back to OLMo-core: every tensor of `model`, bit-exact."""
    again = checkpoint.state_dict(checkpoint.load_model(hf_to_core(hf_dir, tmp_path / "back")))
    for name, tensor in checkpoint.state_dict(model).items():
        assert torch.equal(again[name], tensor), name


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_repo_model_converts_to_repo_olmo2_with_the_same_logits_and_positions(tmp_path, kv_heads):
    """OLMo-core RePo model -> `repo_olmo2` (remote code included): logits and positions of HF equal OLMo-core's
    in fp32 within the rounding bound; back to OLMo-core bit-exact."""
    config = olmo2_tiny("repo", 1, vocab_size=4096, n_kv_heads=kv_heads)
    model, core_dir = _save_core(tmp_path, config)
    hf_dir = core_to_hf(core_dir, tmp_path / "hf")
    saved = json.loads((hf_dir / "config.json").read_text())
    assert saved["model_type"] == "repo_olmo2" and saved["pe_start_layer"] == 1
    assert (hf_dir / "modeling_repo_olmo2.py").is_file() and (hf_dir / "rope.py").is_file()
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32).eval()
    _assert_same_model(hf, model, config, kv_heads)
    _assert_round_trip(hf_dir, model, tmp_path)


def test_demo_base_model_round_trips_and_matches_hf(tmp_path):
    """The demo's base model (HF olmo2, bf16, tied embeddings) -> OLMo-core -> HF: bit-exact, plain olmo2;
    OLMo-core's logits equal transformers' (fp32 copies of the bf16 weights)."""
    core_dir = hf_to_core(BASE_DIR, tmp_path / "core")
    assert checkpoint.is_checkpoint(core_dir)
    config = checkpoint.model_config(core_dir)
    assert config.tie_word_embeddings and config.dtype == "bfloat16"
    back = core_to_hf(core_dir, tmp_path / "hf")
    saved, stock_config = (json.loads((d / "config.json").read_text()) for d in (back, BASE_DIR))
    assert saved["model_type"] == "olmo2"
    assert saved["max_position_embeddings"] == stock_config["max_position_embeddings"] == 512  # no default
    stock = Olmo2ForCausalLM.from_pretrained(BASE_DIR)
    again = Olmo2ForCausalLM.from_pretrained(back)
    for (name, a), (_, b) in zip(stock.state_dict().items(), again.state_dict().items(), strict=True):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), name
    fp32 = core_config_from_hf(read_hf_config(BASE_DIR))  # the same model with fp32 parameters
    model = checkpoint.load_model(core_dir, fp32).eval()  # torch.distributed.checkpoint upcasts exactly
    ids = torch.randint(2, 4096, (1, 32))
    with torch.no_grad():
        assert_within(
            model(ids), stock.float()(ids).logits, roundings=2 * logit_roundings(config, 32), what="logits"
        )


def test_bad_inputs_fail_in_one_line_and_write_nothing(tmp_path):
    with pytest.raises(RepoError, match=r"not an OLMo-core checkpoint.*Hugging Face directory"):
        core_to_hf(BASE_DIR, tmp_path / "out")
    olmo = tmp_path / "olmo"
    olmo.mkdir()
    (olmo / "config.yaml").write_text("model: {}\n")
    (olmo / "model.pt").write_bytes(b"")
    with pytest.raises(RepoError, match=r"ai2-olmo checkpoint"):
        core_to_hf(olmo, tmp_path / "out")
    config = olmo2_tiny("repo", 1, vocab_size=4096, block_name="default")
    _, core_dir = _save_core(tmp_path, config)
    with pytest.raises(RepoError, match=r"model.block.name=default: not the Olmo 2 or Olmo 3 shape"):
        core_to_hf(core_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _olmo3_tiny(pe_mode: str, kv_heads: int | None, window: int = 5):
    """An Olmo-3-shaped tiny config: sliding windows of `window` in layers 0-2 (OLMo 3's pattern), layer 3 full."""
    pattern = SlidingWindowAttentionConfig(
        pattern=[window, window, window, -1], force_full_attention_on_first_layer=False
    )
    return olmo2_tiny(pe_mode, 1, vocab_size=4096, n_kv_heads=kv_heads, sliding_window=pattern)


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_olmo3_shape_converts_to_repo_olmo3_with_the_same_logits_and_positions(tmp_path, kv_heads):
    """OLMo-core's Olmo 3 shape (sliding windows shorter than the sequence, RePo in sliding and full layers) ->
    `repo_olmo3` with its remote code: HF's logits and positions equal OLMo-core's in fp32, a KV-cache decode
    equals HF's full forward, and back to OLMo-core bit-exact."""
    config = _olmo3_tiny("repo", kv_heads)
    model, core_dir = _save_core(tmp_path, config)
    hf_dir = core_to_hf(core_dir, tmp_path / "hf")
    saved = json.loads((hf_dir / "config.json").read_text())
    assert saved["model_type"] == "repo_olmo3" and saved["sliding_window"] == 5
    assert saved["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    assert saved["auto_map"]["AutoModelForCausalLM"] == "modeling_repo_olmo3.RepoOlmo3ForCausalLM"
    for name in (
        "modeling_repo_olmo3.py",
        "modeling_repo_olmo2.py",
        "configuration_repo_olmo3.py",
        "rope.py",
    ):
        assert (hf_dir / name).is_file(), name
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32).eval()
    assert type(hf).__name__ == "RepoOlmo3ForCausalLM"
    assert model.blocks["0"].attention.backend.window_size != (-1, -1), "layer 0 slides"
    ids, logits, roundings = _assert_same_model(hf, model, config, kv_heads)
    with (
        torch.no_grad()
    ):  # the sliding layers' cache keeps only the window, of keys rotated by their positions
        step = hf(ids[:, :10], use_cache=True)
        cache, decoded = step.cache, [step.logits]
        for t in range(10, 24):
            step = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = step.cache
            decoded.append(step.logits)
    assert_within(torch.cat(decoded, 1), logits, roundings=roundings, what="cached decoding")
    _assert_round_trip(hf_dir, model, tmp_path)


def test_the_window_matters(tmp_path):
    """The parity above is not blind to windows: the same weights with full attention everywhere give other
    logits than the Olmo 3 shape (the window is shorter than the sequence), in OLMo-core and in HF alike."""
    config = _olmo3_tiny("rope", None, window=3)
    model, core_dir = _save_core(tmp_path, config)
    hf_dir = core_to_hf(core_dir, tmp_path / "hf")
    assert json.loads((hf_dir / "config.json").read_text())["model_type"] == "olmo3"
    full = Olmo2ForCausalLM.from_pretrained(core_to_hf(_full_attention(tmp_path, core_dir), tmp_path / "hf2"))
    sliding = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = torch.randint(2, 4096, (1, 24))
    with torch.no_grad():
        core, windowed, unwindowed = model(ids), sliding(ids).logits, full.eval()(ids).logits
    assert_within(windowed, core, roundings=2 * logit_roundings(config, 24), what="logits")
    assert (windowed[:, 4:] - unwindowed[:, 4:]).abs().amax() > 1e-2
    within = 2 * logit_roundings(config, 24)  # the first 3 tokens see no farther than the window: same logits
    assert_within(windowed[:, :3], unwindowed[:, :3], roundings=within, what="logits within the window")


def _full_attention(tmp_path, core_dir):
    """The checkpoint `core_dir` with its config's sliding windows removed (same weights)."""
    config = checkpoint.model_config(core_dir)
    config.block.sequence_mixer.sliding_window = None
    out = tmp_path / "full"
    out.mkdir()
    model = checkpoint.load_model(core_dir)
    saved = {**checkpoint.read_config(core_dir), "model": config.as_config_dict()}
    checkpoint.save_model(model, saved, out)
    return out


def test_olmo3_with_different_ropes_per_layer_type_is_refused_naming_the_key(tmp_path):
    """An HF Olmo 3 whose sliding and full layers have different RoPEs (OLMo 3's long-context models scale
    only the full ones) has no OLMo-core config of one RoPE: one line naming the key, nothing written."""
    from transformers import Olmo3Config, Olmo3ForCausalLM

    config = Olmo3Config(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=96, vocab_size=128,
        sliding_window=6, eos_token_id=0, pad_token_id=1,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        },
    )  # fmt: skip
    Olmo3ForCausalLM(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(
        RepoError, match=r"rope_parameters.sliding_attention and rope_parameters.full_attention"
    ):
        hf_to_core(tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape", ["olmo2", "olmo3"])
def test_olmo_shapes_convert_llama3_rope_scaling(tmp_path, shape):
    """Llama 3's RoPE scaling (OLMo-core's step-wise scaling, its original length shorter than the test sequence)
    in the Olmo 2 and 3 shapes -> `rope_type: llama3` (Olmo 3: for both layer types): HF's logits and positions
    equal OLMo-core's in fp32, and back to OLMo-core bit-exact."""
    window = SlidingWindowAttentionConfig(pattern=[5, 5, 5, -1], force_full_attention_on_first_layer=False)
    config = olmo2_tiny(
        "repo",
        1,
        vocab_size=4096,
        rope_scaling=StepwiseRoPEScalingConfig(factor=8.0, old_context_len=8),
        sliding_window=window if shape == "olmo3" else None,
    )
    model, core_dir = _save_core(tmp_path, config)
    hf_dir = core_to_hf(core_dir, tmp_path / "hf")
    rope = json.loads((hf_dir / "config.json").read_text())["rope_parameters"]
    ropes = list(rope.values()) if shape == "olmo3" else [rope]
    assert {r["rope_type"] for r in ropes} == {"llama3"}
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32).eval()
    _assert_same_model(hf, model, config, None)
    _assert_round_trip(hf_dir, model, tmp_path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' has no OLMo-core counterpart; allowed: 'silu'"),
        ({"attention_bias": True}, r"attention_bias=true has no counterpart in the Olmo 2 and 3 shapes"),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e4,
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                    "attention_factor": 1.5,
                }
            },
            r"rope_parameters.attention_factor has no counterpart in OLMo-core's yarn RoPE",
        ),
    ],
)
def test_bad_olmo2_configs_are_refused_in_one_line_naming_the_key(tmp_path, extra, message):
    """An HF Olmo 2 that OLMo-core's Olmo 2 shape cannot express: one line naming the key, nothing written."""
    config = Olmo2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        vocab_size=128,
        **extra,
    )
    Olmo2ForCausalLM(config).save_pretrained(tmp_path / "bad")
    with pytest.raises(RepoError, match=message) as error:
        hf_to_core(tmp_path / "bad", tmp_path / "out")
    assert len(str(error.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_conversion_rerun_with_force_writes_the_same_and_without_refuses(tmp_path):
    """Both directions (Olmo 3 shape, GQA): a rerun without --force refuses and changes nothing; with --force it
    writes the same bytes (torch.distributed.checkpoint's .metadata aside: it holds a new save id and the
    staging path; what it describes, and every tensor, is the same)."""
    import pickle

    model, core_dir = _save_core(tmp_path, _olmo3_tiny("repo", 2))
    hf_dir = core_to_hf(core_dir, tmp_path / "hf")
    first = _files(hf_dir)
    with pytest.raises(FileExistsError, match="pass --force"):
        core_to_hf(core_dir, hf_dir)
    assert _files(hf_dir) == first
    assert _files(core_to_hf(core_dir, hf_dir, force=True)) == first

    back = hf_to_core(hf_dir, tmp_path / "back")
    first = _files(back)
    with pytest.raises(FileExistsError, match="pass --force"):
        hf_to_core(hf_dir, back)
    assert _files(back) == first
    again = _files(hf_to_core(hf_dir, back, force=True))
    metadata = "model_and_optim/.metadata"
    described = [pickle.loads(files.pop(metadata)).state_dict_metadata for files in (first, again)]
    assert again == first and described[0] == described[1]
    _assert_round_trip(hf_dir, model, tmp_path / "again")


def test_a_checkpoint_without_its_training_length_needs_it_given(tmp_path):
    """No default stands in for the length an HF config's max_position_embeddings carries (evaluation extends
    the context from it): a checkpoint that records none is refused, naming the key and the flag."""
    config = olmo2_tiny("repo", 1, vocab_size=4096)
    _, core_dir = _save_core(tmp_path, config, length=None)
    with pytest.raises(
        RepoError, match=r"records no training length \(train_module.max_sequence_length\).*--max-"
    ):
        core_to_hf(core_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    hf_dir = core_to_hf(core_dir, tmp_path / "hf", max_position_embeddings=256)
    assert json.loads((hf_dir / "config.json").read_text())["max_position_embeddings"] == 256
    recorded = hf_to_core(hf_dir, tmp_path / "back")  # records the HF model's length
    again = core_to_hf(recorded, tmp_path / "hf2")
    assert json.loads((again / "config.json").read_text())["max_position_embeddings"] == 256


@pytest.mark.parametrize("shape", ["olmo2-repo", "olmo2-gqa-rope", "olmo3-gqa-repo", "olmo3-nope"])
def test_round_trips_keep_every_config_value(tmp_path, shape):
    """OLMo-core -> HF -> OLMo-core -> HF: both configs come back whole, but for the keys tests/round_trips.py
    lists with their reasons (training length, RoPE, windows, norms, position modes all kept)."""
    family, *rest = shape.split("-")
    kv_heads = 2 if "gqa" in rest else None
    if family == "olmo3":
        config = _olmo3_tiny(rest[-1], kv_heads)
    else:
        config = olmo2_tiny(rest[-1], 1, vocab_size=4096, n_kv_heads=kv_heads)
    _, core_dir = _save_core(tmp_path, config)
    hf_dir = core_to_hf(core_dir, tmp_path / "hf")
    core_again = hf_to_core(hf_dir, tmp_path / "core-again")
    hf_again = core_to_hf(core_again, tmp_path / "hf-again")
    hf_configs = [json.loads((d / "config.json").read_text()) for d in (hf_dir, hf_again)]
    assert config_differences(*hf_configs, HF_MAY_DIFFER) == {}
    core_configs = [checkpoint.read_config(d) for d in (core_dir, core_again)]
    all_rope = ALL_ROPE_MAY_DIFFER if rest[-1] == "rope" else {}
    assert config_differences(*core_configs, {**CORE_MAY_DIFFER, **all_rope}) == {}
    windows = [checkpoint.model_config(d).block.sequence_mixer.sliding_window for d in (core_dir, core_again)]
    n = config.n_layers
    resolved = [
        [w.should_use_swa(i, n) and w.get_window_size(i, n) if w else False for i in range(n)]
        for w in windows
    ]
    assert resolved[0] == resolved[1]


def test_a_stock_hf_model_round_trips_with_its_whole_config(tmp_path):
    """The demo's base (stock HF olmo2, bf16, tied embeddings): HF -> OLMo-core -> HF keeps every value."""
    back = core_to_hf(hf_to_core(BASE_DIR, tmp_path / "core"), tmp_path / "hf")
    configs = [json.loads((d / "config.json").read_text()) for d in (BASE_DIR, back)]
    assert config_differences(*configs, HF_MAY_DIFFER) == {}
