"""OLMo-core checkpoints <-> Hugging Face (`olmo_repo.olmocore.hf`): the same model everywhere."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Olmo2ForCausalLM

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2 with the Auto classes)
from olmo_repo.demo import BASE_DIR
from olmo_repo.errors import RepoError
from olmo_repo.hf import read_hf_config
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.attention import RepoAttention
from olmo_repo.olmocore.convert import core_config_from_hf
from olmo_repo.olmocore.hf import core_to_hf, hf_to_core
from olmo_repo.rope import record_positions

from .tiny import assert_within, olmo2_tiny

TOKENIZER = {
    "identifier": str(BASE_DIR / "tokenizer.json"),
    "vocab_size": 4096,
    "eos_token_id": 0,
    "pad_token_id": 1,
}


def _roundings(config, seq_len: int) -> int:
    """Worst-case rounding count of the logits of an Olmo-2-shaped model (tests/numerics.py's count)."""
    d, hidden = config.d_model, config.block.feed_forward.hidden_size
    block = 8 * d + d // config.block.sequence_mixer.n_heads + seq_len + hidden + d // 8
    return config.n_layers * block + 2 * d


def _save_core(tmp_path, config, spread: float = 3000.0):
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=64)
    with torch.no_grad():
        for block in model.blocks.values():
            if isinstance(block.attention, RepoAttention) and block.attention.pe_mode == "repo":
                block.attention.final_map.weight.mul_(spread)
    out = tmp_path / "core"
    out.mkdir()
    checkpoint.save_model(model, {"model": config.as_config_dict(), "dataset": {"tokenizer": TOKENIZER}}, out)
    return model.eval(), out


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
    ids = torch.randint(2, 4096, (2, 24))
    with torch.no_grad(), record_positions(model) as positions:
        logits = model(ids)
    with torch.no_grad():
        out = hf(ids, output_positions=True)
    roundings = 2 * _roundings(config, 24)
    assert_within(out.logits, logits, roundings=roundings, what="logits")
    assert sorted(out.positions) == sorted(positions) == [1, 2, 3]
    for layer, z in positions.items():
        assert z.shape == (2, kv_heads or 4, 24) and z.abs().max() > 1.0
        assert_within(out.positions[layer], z, roundings=roundings, what=f"positions of layer {layer}")
    back = hf_to_core(hf_dir, tmp_path / "back")
    again = checkpoint.state_dict(checkpoint.load_model(back))
    for name, tensor in checkpoint.state_dict(model).items():
        assert torch.equal(again[name], tensor), name


def test_demo_base_model_round_trips_and_matches_hf(tmp_path):
    """The demo's base model (HF olmo2, bf16, tied embeddings) -> OLMo-core -> HF: bit-exact, plain olmo2;
    OLMo-core's logits equal transformers' (fp32 copies of the bf16 weights)."""
    core_dir = hf_to_core(BASE_DIR, tmp_path / "core")
    assert checkpoint.is_checkpoint(core_dir)
    config = checkpoint.model_config(core_dir)
    assert config.tie_word_embeddings and config.dtype == "bfloat16"
    back = core_to_hf(core_dir, tmp_path / "hf")
    assert json.loads((back / "config.json").read_text())["model_type"] == "olmo2"
    stock = Olmo2ForCausalLM.from_pretrained(BASE_DIR)
    again = Olmo2ForCausalLM.from_pretrained(back)
    for (name, a), (_, b) in zip(stock.state_dict().items(), again.state_dict().items(), strict=True):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), name
    fp32 = core_config_from_hf(read_hf_config(BASE_DIR))  # the same model with fp32 parameters
    model = checkpoint.load_model(core_dir, fp32).eval()  # torch.distributed.checkpoint upcasts exactly
    ids = torch.randint(2, 4096, (1, 32))
    with torch.no_grad():
        assert_within(
            model(ids), stock.float()(ids).logits, roundings=2 * _roundings(config, 32), what="logits"
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
    with pytest.raises(RepoError, match=r"model.block.name=default: not the Olmo 2 shape"):
        core_to_hf(core_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_olmo3_shape_is_refused_naming_the_key():
    """Sliding windows (OLMo 3) have no `repo_olmo2` counterpart: the converter says which key, before any I/O."""
    from olmo_core.nn.attention import SlidingWindowAttentionConfig

    from olmo_repo.olmocore.convert import hf_config_from_core

    window = SlidingWindowAttentionConfig(pattern=[8, 8, 8, -1], force_full_attention_on_first_layer=False)
    with pytest.raises(ValueError, match=r"model.block.sequence_mixer.sliding_window=.*not the Olmo 2 shape"):
        hf_config_from_core(olmo2_tiny("repo", 1, sliding_window=window), eos_token_id=0, pad_token_id=1)
