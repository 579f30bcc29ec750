"""Hugging Face side: OLMo <-> HF parity per position mode, KV cache, YaRN, remote code, conversions, errors.

Everything is real: tiny OLMo models are saved as checkpoints, converted with the package's converters and
loaded with transformers' `from_pretrained` from temporary directories (offline).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoModel, AutoModelForCausalLM, Olmo2Config, Olmo2ForCausalLM, Olmo2Model

import olmo_repo.hf  # noqa: F401  (registers repo_olmo2 with the Auto classes)
from olmo_repo import (
    build_model,
    layer_modes,
    predict_positions,
)
from olmo_repo.ai2olmo.convert import hf_config_from_olmo
from olmo_repo.ai2olmo.hf import convert_from_hf, convert_to_hf
from olmo_repo.checkpoint import as_hf_dir, load_model
from olmo_repo.cli.convert_from_hf import main as convert_from_hf_main
from olmo_repo.cli.convert_to_hf import main as convert_to_hf_main
from olmo_repo.errors import CorruptFileError
from olmo_repo.hf import RepoOlmo2Config, RepoOlmo2ForCausalLM, RepoOlmo2Model, read_hf_config
from olmo_repo.hf.modeling_repo_olmo2 import RepoOlmo2Attention
from olmo_repo.output import staged_dir

from .conftest import EMBEDDING, EOS, PAD, ROOT, VOCAB, make_checkpoint, tiny_config
from .numerics import assert_within, model_roundings, rotation_roundings

MODES = {
    "repo": dict(pe_mode="repo", pe_start_layer=1),
    "rope": dict(),
    "nope": dict(pe_mode="nope"),
    "hybrid-repo": dict(pe_mode="repo", pe_layer_ids=[0, 2]),
    "hybrid-nope": dict(pe_mode="nope", pe_layer_ids=[1, 3]),  # R2N1-like
    "nope-gqa": dict(pe_mode="nope", pe_layer_ids=[1, 3], n_kv_heads=2),
    "repo-gqa": dict(pe_mode="repo", pe_start_layer=1, n_kv_heads=2),  # one position per key/value head
    "repo-mqa": dict(pe_mode="repo", pe_layer_ids=[1, 3], n_kv_heads=1),  # multi-query
}


def _ids(T: int = 24, B: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T))


def _assert_same_logits(got: torch.Tensor, olmo, ids: torch.Tensor, what: str = "HF logits") -> None:
    """HF and OLMo compute the same logits in fp32 with their own kernels: two fp32 results, each within the
    model's rounding bound of the exact logits."""
    with torch.no_grad():
        expected = olmo(ids).logits
    print(f"\nmax |{what} - OLMo logits|: {(got - expected).abs().max().item():.3g}")
    assert_within(got, expected, roundings=2 * model_roundings(olmo.config, ids.shape[1]), what=what)


@pytest.fixture(params=list(MODES))
def converted(request, tmp_path, tokenizer_file):
    """(mode name, OLMo model, HF dir) for every position mode."""
    ckpt, model = make_checkpoint(tmp_path / "olmo", tokenizer_file, **MODES[request.param])
    out = convert_to_hf(ckpt, tmp_path / "hf")
    return request.param, model, out


# --------------------------------------------------------------------------------------------- parity


def test_logits_match_olmo(converted):
    mode, olmo, hf_dir = converted
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    if mode == "rope":  # no RePo/NoPE layer: a plain Olmo2 checkpoint that stock transformers loads
        assert type(hf) is Olmo2ForCausalLM and hf.config.model_type == "olmo2"
        assert not (hf_dir / "modeling_repo_olmo2.py").exists()
    else:
        assert type(hf) is RepoOlmo2ForCausalLM and layer_modes(hf.config) == [
            str(m) for m in layer_modes(olmo.config)
        ]
    ids = _ids()
    with torch.no_grad():
        _assert_same_logits(hf(ids).logits, olmo, ids, f"HF logits, {mode}")


def test_output_positions_are_the_olmo_positions(converted):
    mode, olmo, hf_dir = converted
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = _ids()
    expected = predict_positions(olmo, ids)
    if mode == "rope":
        return
    with torch.no_grad():
        out = hf(ids, output_positions=True)
        base = hf.model(ids, output_positions=True)
    assert sorted(out.positions) == sorted(expected)
    assert not expected or max(z.max() - z.min() for z in expected.values()) > 10  # rotations matter here
    roundings = 2 * model_roundings(olmo.config, 24)  # positions of a layer: the forward up to it, f_phi
    for layer, z in expected.items():
        n_kv = olmo.config.effective_n_kv_heads  # one position per key/value head
        assert out.positions[layer].shape == (2, n_kv, 24) and out.positions[layer].dtype == torch.float32
        assert_within(out.positions[layer], z, roundings=roundings, what=f"positions of layer {layer}")
        assert_within(base.positions[layer], z, roundings=roundings, what=f"base positions of layer {layer}")
    with torch.no_grad():
        as_tuple = hf(ids, output_positions=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and as_tuple[-1].keys() == expected.keys()


# --------------------------------------------------------------------------------------------- cache


def test_generate_with_cache_equals_without(converted):
    mode, olmo, hf_dir = converted
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    prompt = _ids(T=8)
    kwargs = dict(max_new_tokens=16, do_sample=False, min_new_tokens=16, eos_token_id=None)
    cached = hf.generate(prompt, use_cache=True, **kwargs)
    uncached = hf.generate(prompt, use_cache=False, **kwargs)
    assert cached.shape == (2, 24)
    assert torch.equal(cached, uncached), mode
    # Stronger: incremental decoding with the cache reproduces the full forward's logits.
    with torch.no_grad():
        full = hf(cached).logits
        out = hf(cached[:, :10], use_cache=True)
        pieces, cache = [out.logits], out.cache
        for t in range(10, cached.shape[1]):
            out = hf(cached[:, t : t + 1], cache=cache, use_cache=True)
            pieces.append(out.logits)
            cache = out.cache
    roundings = 2 * model_roundings(olmo.config, cached.shape[1])  # differently shaped kernels
    assert_within(torch.cat(pieces, dim=1), full, roundings=roundings, what="cached decoding")


# --------------------------------------------------------------------------------------------- YaRN


def _yarn_formula(head_dim: int, theta: float, factor: float, original: int) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023, sec. 3.2-3.4) written out: per frequency, interpolate (divide by the factor) the
    wavelengths longer than the original context / beta_slow(=1) rotations, keep those with more than
    beta_fast(=32) rotations, ramp linearly between; attention temperature sqrt(1/t) = 0.1 ln(s) + 1."""
    d = head_dim
    k = torch.arange(d // 2, dtype=torch.float64)
    base = theta ** (-2 * k / d)

    def dim_of(rotations: float) -> float:  # the dimension index whose frequency does `rotations` turns
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(dim_of(32)), 0), min(math.ceil(dim_of(1)), d - 1)
    ramp = ((k - low) / (high - low)).clamp(0, 1)  # 0: extrapolate (keep), 1: interpolate
    inv_freq = base * (1 - ramp) + base / factor * ramp
    return inv_freq, 0.1 * math.log(factor) + 1.0


def _attention_by_hand(attn, x, positions, inv_freq, scale):
    """Causal attention of one layer, computed in float64 from the plain RoPE formula (no package code)."""
    B, T, _ = x.shape
    H = attn.config.num_attention_heads
    q = attn.q_norm(attn.q_proj(x)).view(B, T, H, -1).transpose(1, 2).double()
    k = attn.k_norm(attn.k_proj(x)).view(B, T, H, -1).transpose(1, 2).double()
    v = attn.v_proj(x).view(B, T, H, -1).transpose(1, 2).double()
    angles = positions.double()[..., None] * inv_freq  # [B, H, T, d/2]
    cos, sin = torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)

    def rot(t):
        t1, t2 = t.chunk(2, dim=-1)
        return (t * cos + torch.cat((-t2, t1), dim=-1) * sin) * scale

    q, k = rot(q), rot(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
    return attn.o_proj(out.to(x.dtype))


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])
def test_yarn_applies_to_rope_layers_and_repo_positions(tmp_path, tokenizer_file, spelling):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    factor, original, theta = 4.0, 16, 500_000.0
    if spelling == "rope_parameters":  # transformers 5.x, here as a from_pretrained override
        yarn = dict(
            rope_type="yarn", rope_theta=theta, factor=factor, original_max_position_embeddings=original
        )
        model = AutoModelForCausalLM.from_pretrained(hf_dir, rope_parameters=yarn).eval()
    else:  # the legacy config.json keys (rope_theta + rope_scaling), as older checkpoints write them
        config = json.loads((hf_dir / "config.json").read_text())
        del config["rope_parameters"]
        config["rope_theta"] = theta
        config["rope_scaling"] = {
            "type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
        }
        (hf_dir / "config.json").write_text(json.dumps(config))
        model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert model.config.rope_parameters["rope_type"] == "yarn"
    inv_freq, scale = _yarn_formula(16, theta, factor, original)
    assert abs(scale - (0.1 * math.log(4) + 1)) < 1e-12
    for rotary in [model.model.rotary_emb] + [layer.self_attn.rotary_emb for layer in model.model.layers[1:]]:
        # fp32 theta ** x is off by ~|ln(theta) x| eps relative; the YaRN blend rounds a few times more.
        assert_within(
            rotary.inv_freq, inv_freq, roundings=math.log(theta) + 4, magnitude=inv_freq, what="inv_freq"
        )
        assert rotary.attention_scaling == pytest.approx(scale)
    assert (
        inv_freq - _yarn_formula(16, theta, 1.0, original)[0]
    ).abs().max() > 1e-3  # YaRN changes something

    x = torch.randn(2, 40, 64)  # longer than the original context
    ids = torch.arange(40)
    with torch.no_grad():
        # A stock RoPE layer: integer positions.
        rope_attn = model.model.layers[0].self_attn
        cos_sin = model.model.rotary_emb(x, ids[None])
        got, _ = rope_attn(x, cos_sin, None)
        want = _attention_by_hand(rope_attn, x, ids.expand(2, 4, 40), inv_freq, scale)
        # The same fp32 projections; rotation of q and k, scores over head_dim, softmax, sum over 40 tokens,
        # o_proj over d_model.
        roundings = 2 * rotation_roundings(ids.float(), inv_freq) + 16 + 4 + 40 + 64
        assert_within(got, want, roundings=roundings, what="YaRN RoPE layer")
        # A RePo layer: its own predicted positions, same inv_freq and attention factor.
        repo_attn = model.model.layers[2].self_attn
        assert isinstance(repo_attn, RepoOlmo2Attention)
        z = repo_attn.predict_positions(x)
        assert z.abs().max() > 1.0
        got, _ = repo_attn(x, cos_sin, None)
        want = _attention_by_hand(repo_attn, x, z, inv_freq, scale)
        roundings = 2 * rotation_roundings(z, inv_freq) + 16 + 4 + 40 + 64
        assert_within(got, want, roundings=roundings, what="YaRN RePo layer")
        # The whole model still decodes with the cache under YaRN.
        prompt = _ids(T=8)
        kwargs = dict(max_new_tokens=8, do_sample=False, min_new_tokens=8, eos_token_id=None)
        assert torch.equal(
            model.generate(prompt, **kwargs), model.generate(prompt, use_cache=False, **kwargs)
        )


# ------------------------------------------------------------------------------------------- remote code


def test_every_remote_code_file_is_an_output_name():
    """What a converter writes, a rerun with --force may replace (olmo_repo.output): nothing it copies is taken for
    a user's file."""
    import fnmatch

    from olmo_repo.hf.files import REMOTE_CODE
    from olmo_repo.output import OUTPUT_NAMES

    names = {name for files in REMOTE_CODE.values() for name in files}
    assert {"modeling_repo_olmo3.py", "modeling_repo_olmo2.py", "rope.py"} <= names
    assert all(any(fnmatch.fnmatchcase(n, p) for p in OUTPUT_NAMES) for n in names), names


_BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("olmo_repo", "olmo", "olmo_data"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
"""

_REMOTE_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
hf_dir, ids_file, out_file = sys.argv[1:]
model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
assert tok.decode(tok("hello RePo").input_ids) == "hello RePo"
ids = torch.load(ids_file)
with torch.no_grad():
    out = model(ids, output_positions=True)
    gen = model.generate(ids[:, :8], max_new_tokens=8, do_sample=False, min_new_tokens=8, eos_token_id=None)
torch.save({"logits": out.logits, "positions": out.positions, "generated": gen}, out_file)
try:
    import olmo_repo
except ImportError:
    pass
else:
    raise SystemExit("olmo_repo was importable")
"""


@pytest.mark.slow
def test_remote_code_loads_with_only_transformers(tmp_path, tokenizer_file):
    ckpt, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_repo_olmo2.RepoOlmo2ForCausalLM"
    assert (hf_dir / "rope.py").read_text() == (ROOT / "olmo_repo" / "rope.py").read_text()
    ids = _ids()
    torch.save(ids, tmp_path / "ids.pt")
    script = tmp_path / "load.py"
    script.write_text(_BLOCKER + _REMOTE_LOAD)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    subprocess.run(
        [sys.executable, str(script), str(hf_dir), str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")],
        check=True,
        cwd=tmp_path,
        env=env,
    )
    got = torch.load(tmp_path / "out.pt")
    _assert_same_logits(got["logits"], olmo, ids, "remote-code HF logits")
    expected = predict_positions(olmo, ids)
    for layer, z in expected.items():
        roundings = 2 * model_roundings(olmo.config, ids.shape[1])
        assert_within(got["positions"][layer], z, roundings=roundings, what=f"positions of layer {layer}")
    local = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    kwargs = dict(max_new_tokens=8, do_sample=False, min_new_tokens=8, eos_token_id=None)
    assert torch.equal(got["generated"], local.generate(ids[:, :8], **kwargs))


# ------------------------------------------------------------------------------------------- other directions


def test_round_trip_olmo_hf_olmo_is_bit_exact(converted, tmp_path):
    mode, olmo, hf_dir = converted
    back = convert_from_hf(hf_dir, tmp_path / "back")
    original = torch.load(tmp_path / "olmo" / "model.pt", weights_only=True)
    restored = torch.load(back / "model.pt", weights_only=True)
    assert restored.keys() == original.keys()
    for key, tensor in original.items():
        assert restored[key].dtype == tensor.dtype and torch.equal(restored[key], tensor), key
    reloaded = load_model(back)
    assert layer_modes(reloaded.config) == layer_modes(olmo.config)
    assert reloaded.config.vocab_size == VOCAB and reloaded.config.embedding_size == EMBEDDING
    ids = _ids()
    assert torch.equal(reloaded(ids).logits, olmo(ids).logits)
    assert torch.load(back / "train.pt", weights_only=True)["global_step"] == 0


def test_stock_hf_olmo2_converts_to_an_olmo_checkpoint(tmp_path, tokenizer_file, capsys):
    """A stock transformers Olmo2 checkpoint (as an OLMo-2 stage-1 revision is) -> OLMo init checkpoint."""
    config = Olmo2Config(
        vocab_size=EMBEDDING,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        rms_norm_eps=1e-6,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    hf = Olmo2ForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(tokenizer_file.read_text())
    olmo_dir = convert_from_hf(tmp_path / "hf", tmp_path / "olmo")
    olmo = load_model(olmo_dir)
    assert olmo.config.vocab_size == VOCAB and olmo.config.embedding_size == EMBEDDING
    assert olmo.config.rope_theta == 500_000 and olmo.config.mlp_hidden_size == 256
    ids = _ids()
    with torch.no_grad():
        _assert_same_logits(hf(ids).logits, olmo, ids, "stock HF Olmo2 logits")
    # As stage-1 init for a RePo model: every stock tensor loads, only f_phi is new.
    repo = build_model(tiny_config(**{**olmo.config.asdict(), "pe_mode": "repo", "pe_start_layer": 1}))
    missing, unexpected = repo.load_state_dict(
        torch.load(olmo_dir / "model.pt", weights_only=True), strict=False
    )
    assert not unexpected and {k.rsplit(".", 2)[-2] for k in missing} == {
        "gate_map",
        "content_map",
        "final_map",
    }
    # Without a tokenizer.json: said in one line, as by OLMo-core's converter (tests/core/test_convert_families.py).
    capsys.readouterr()
    (tmp_path / "hf" / "tokenizer.json").unlink()
    convert_from_hf(tmp_path / "hf", tmp_path / "bare")
    err = capsys.readouterr().err  # then the progress bar of the weights
    assert err.startswith(
        f"{tmp_path / 'hf'} has no tokenizer.json: the checkpoint records no tokenizer (a run's config names its "
        "data's; converting it back to HF then takes --tokenizer)\n"
    )


def _reference_dir(path: Path, olmo, pe_config: dict) -> Path:
    """A checkpoint as the reference implementation's converter writes it: a stock `olmo2` config.json with
    `pe_config` (misspelled keys included), RePo weights under `self_attn`, stale `rotary_emb.inv_freq` buffers."""
    hf_config = hf_config_from_olmo(olmo.config)
    raw = Olmo2Config(**{k: v for k, v in hf_config.to_dict().items() if not k.startswith("pe_")}).to_dict()
    raw["pe_config"] = pe_config
    path.mkdir()
    (path / "config.json").write_text(json.dumps(raw))
    from olmo_repo.ai2olmo.convert import hf_state_dict_from_olmo

    state_dict = hf_state_dict_from_olmo(olmo.state_dict(), hf_config)
    for i in range(olmo.config.n_layers):
        state_dict[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, path / "model.safetensors")
    return path


REFERENCE_CASES = {
    "repo from layer 1": (
        dict(pe_mode="repo", pe_start_layer=1),
        # its converter writes both spellings; its model reads the misspelled ones
        {
            "dynamic_pe_mode": "swigluex_multihead",
            "dynmaic_pe_start_layer": 1,
            "dynmaic_pe_layer_ids": "",
            "dynamic_pe_start_layer": 1,
            "dynamic_pe_layer_ids": "",
        },
    ),
    "repo in layers 1,3": (
        dict(pe_mode="repo", pe_layer_ids=[1, 3]),
        {"dynamic_pe_mode": "swigluex_multihead", "dynmaic_pe_start_layer": 0, "dynmaic_pe_layer_ids": "1,3"},
    ),
    "nope": (dict(pe_mode="nope"), {"dynamic_pe_mode": "nope", "dynmaic_pe_start_layer": 0}),
    # grouped-query attention (which the reference cannot run): one position per key/value head
    "repo gqa": (
        dict(pe_mode="repo", pe_start_layer=1, n_kv_heads=2),
        {"dynamic_pe_mode": "swigluex_multihead", "dynmaic_pe_start_layer": 1},
    ),
    # Only the correctly spelled keys: the reference's model ignores them and puts RePo in every layer.
    "correct spelling only": (
        dict(pe_mode="repo"),
        {"dynamic_pe_mode": "swigluex_multihead", "dynamic_pe_start_layer": 2, "dynamic_pe_layer_ids": "2"},
    ),
}


@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_reference_format_loads_through_every_route(tmp_path, tokenizer_file, case):
    """A reference-format directory: the project's HF classes and the Auto classes (after `import
    olmo_repo.hf`) read its pe_config like the reference's model, and both converters take it."""
    overrides, pe_config = REFERENCE_CASES[case]
    _, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file, **overrides)
    ref = _reference_dir(tmp_path / "ref", olmo, pe_config)
    modes = [str(m) for m in layer_modes(olmo.config)]
    config = read_hf_config(ref)
    assert isinstance(config, RepoOlmo2Config) and layer_modes(config) == modes
    ids = _ids()
    routes = {
        "RepoOlmo2ForCausalLM": lambda: RepoOlmo2ForCausalLM.from_pretrained(ref),
        "AutoModelForCausalLM": lambda: AutoModelForCausalLM.from_pretrained(ref),
        "converted": lambda: AutoModelForCausalLM.from_pretrained(
            convert_to_hf(ref, tmp_path / "hf", tokenizer=str(tokenizer_file))
        ),
    }
    for route, load in routes.items():
        hf = load().eval()
        assert type(hf) is RepoOlmo2ForCausalLM and layer_modes(hf.config) == modes, route
        with torch.no_grad():
            _assert_same_logits(hf(ids).logits, olmo, ids, f"{case} through {route}")
    base = AutoModel.from_pretrained(ref)
    assert type(base) is RepoOlmo2Model and layer_modes(base.config) == modes
    # ... and the same directory also converts straight to an OLMo checkpoint.
    back = load_model(convert_from_hf(ref, tmp_path / "back"))
    assert torch.equal(back(ids).logits, olmo(ids).logits)


def test_a_reference_blend_schedule_is_recorded_and_scores_at_p_zero(tmp_path, tokenizer_file):
    """The reference's pe_config may hold its index-blend schedule; its own forward takes p = 0 unless told
    otherwise (nothing in its released code does), so its checkpoints score with p = 0 here too."""
    _, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    pe_config = {
        "dynamic_pe_mode": "swigluex_multihead",
        "dynmaic_pe_start_layer": 1,
        "dynamic_pe_init_pdrop": 1.0,
        "dynamic_pe_dropout_anneal_step": 1000,
    }
    ref = _reference_dir(tmp_path / "ref", olmo, pe_config)
    config = read_hf_config(ref)
    assert (config.pe_blend_init, config.pe_blend_steps, config.pe_blend) == (1.0, 1000, 0.0)
    hf = AutoModelForCausalLM.from_pretrained(ref).eval()
    assert hf.config.pe_blend == 0.0
    ids = _ids()
    with torch.no_grad():
        _assert_same_logits(hf(ids).logits, olmo, ids, "the reference's checkpoint with a blend schedule")


@pytest.mark.parametrize(
    "overrides, pe_config, message",
    [
        (  # weights in layers 1..3, the misspelled key that the reference's model reads says from 2
            dict(pe_mode="repo", pe_start_layer=1),
            {
                "dynamic_pe_mode": "swigluex_multihead",
                "dynmaic_pe_start_layer": 2,
                "dynamic_pe_start_layer": 1,
            },
            r"the weights carry RePo \(gate_map/content_map/final_map\) in layers \[1, 2, 3\], but pe_config "
            r"selects repo in layers \[2, 3\] "
            r"\(dynamic_pe_mode='swigluex_multihead', dynmaic_pe_start_layer=2, dynmaic_pe_layer_ids=''",
        ),
        (  # RePo weights, but a config without RePo layers
            dict(pe_mode="repo", pe_start_layer=1),
            {"dynamic_pe_mode": "none"},
            r"in layers \[1, 2, 3\], but pe_config selects no RePo layer",
        ),
        (  # NoPE in the config, RePo weights in the checkpoint
            dict(pe_mode="repo", pe_start_layer=1),
            {"dynamic_pe_mode": "nope"},
            r"in layers \[1, 2, 3\], but pe_config selects nope in layers \[0, 1, 2, 3\]",
        ),
    ],
)
def test_reference_weights_and_pe_config_must_agree(tmp_path, tokenizer_file, overrides, pe_config, message):
    """The layers that carry RePo weights are the truth: a pe_config that selects others fails on every
    route with one error naming both (not a missing/unexpected weights list or a silently wrong model)."""
    _, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file, **overrides)
    ref = _reference_dir(tmp_path / "ref", olmo, pe_config)
    for load in (
        lambda: RepoOlmo2ForCausalLM.from_pretrained(ref),
        lambda: AutoModelForCausalLM.from_pretrained(ref),
        lambda: AutoModel.from_pretrained(ref),
        lambda: convert_to_hf(ref, tmp_path / "hf"),
        lambda: convert_from_hf(ref, tmp_path / "back"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(str(ref))}: .*{message}"):
            load()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["olmo", "ref"]


@pytest.mark.slow
def test_stock_olmo2_directories_still_load_as_stock_olmo2(tmp_path, tokenizer_file):
    ckpt, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file)
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    assert json.loads((hf_dir / "config.json").read_text())["model_type"] == "olmo2"
    assert type(AutoModelForCausalLM.from_pretrained(hf_dir)) is Olmo2ForCausalLM
    assert type(AutoModel.from_pretrained(hf_dir)) is Olmo2Model
    assert type(AutoModelForCausalLM.from_config(Olmo2Config(num_hidden_layers=1))) is Olmo2ForCausalLM


def test_hf_layer_selection_agrees_with_olmo():
    for overrides in [
        dict(pe_mode="repo", pe_start_layer=2),
        dict(pe_mode="nope", pe_layer_ids=[2, 5]),
        dict(pe_mode="repo", pe_start_layer=2, pe_layer_ids=[0, 3, 5]),
        dict(),
    ]:
        olmo_config = tiny_config(n_layers=6, **overrides)
        hf_config = RepoOlmo2Config(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, **overrides)
        assert layer_modes(hf_config) == [str(m) for m in layer_modes(olmo_config)]


# ------------------------------------------------------------------------------------------- errors


def test_existing_output_is_refused_unless_forced(tmp_path, tokenizer_file, capsys):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="nope")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--force"):
        convert_to_hf(ckpt, out)
    assert convert_to_hf_main(["--input", str(ckpt), "--output", str(out)]) == 1
    assert "exists" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    force = ["--input", str(ckpt), "--output", str(out), "--force", "--dtype", "bfloat16"]
    assert convert_to_hf_main(force) == 1  # --force replaces only a folder of this project's outputs
    assert "keep.txt" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert convert_to_hf_main(force) == 0 and convert_to_hf_main(force) == 0  # a previous output is replaced
    hf = AutoModelForCausalLM.from_pretrained(out)
    assert hf.config.dtype == torch.bfloat16 and hf.model.embed_tokens.weight.dtype == torch.bfloat16
    assert convert_from_hf_main(["--input", str(out), "--output", str(ckpt)]) == 1  # the input itself
    assert convert_from_hf_main(["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "x")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "olmo"]  # nothing staged is left


def test_failed_conversion_leaves_no_directory(tmp_path, tokenizer_file):
    ckpt, model = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    state_dict = model.state_dict()
    del state_dict["transformer.blocks.2.final_map.weight"]
    torch.save(state_dict, ckpt / "model.pt")
    with pytest.raises(KeyError, match="final_map"):
        convert_to_hf(ckpt, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["olmo"]
    # A failure while writing removes the staging directory and leaves an existing output untouched.
    (tmp_path / "out").mkdir()
    with pytest.raises(RuntimeError), staged_dir(tmp_path / "out", force=True) as staging:
        (staging / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["olmo", "out"] and not any(
        (tmp_path / "out").iterdir()
    )


def test_unsupported_inputs_fail_with_one_clear_error(tmp_path, tokenizer_file):
    with pytest.raises(ValueError, match="norm_after"):
        hf_config_from_olmo(tiny_config(norm_after=False))
    with pytest.raises(StrictDataclassError, match="pe_mode='rep'"):
        RepoOlmo2Config(num_hidden_layers=2, pe_mode="rep")
    with pytest.raises(StrictDataclassError, match="pe_start_layer=4"):
        RepoOlmo2Config(num_hidden_layers=4, pe_mode="repo", pe_start_layer=4)
    with pytest.raises(
        StrictDataclassError, match="num_key_value_heads=3 does not divide num_attention_heads=4"
    ):
        RepoOlmo2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=3, pe_mode="repo")
    with pytest.raises(StrictDataclassError, match="rope_type='dynamic'"):
        RepoOlmo2Config(
            num_hidden_layers=2,
            pe_mode="repo",
            rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
        )
    ckpt, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo")
    ref = _reference_dir(tmp_path / "ref", olmo, {"dynamic_pe_mode": "cope"})
    with pytest.raises(ValueError, match="dynamic_pe_mode='cope'.*allowed: none, nope, swigluex_multihead"):
        convert_to_hf(ref, tmp_path / "hf")
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    config["rope_parameters"] = {
        "rope_type": "yarn",
        "rope_theta": 5e5,
        "factor": 2.0,
        "original_max_position_embeddings": 32,
    }
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type='yarn' has no OLMo equivalent"):
        convert_from_hf(hf_dir, tmp_path / "back")
    with pytest.raises(ValueError, match="nope_tokenizer"):
        convert_to_hf(ckpt, tmp_path / "hf2", tokenizer="nope_tokenizer")
    assert not (tmp_path / "back").exists() and not (tmp_path / "hf2").exists()


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_truncated_weights_fail_with_one_line_naming_the_file(tmp_path, tokenizer_file, capsys):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    _truncate(ckpt / "model.pt")
    _truncate(hf_dir / "model.safetensors")
    capsys.readouterr()
    for main, source, prog in (
        (convert_to_hf_main, ckpt, "convert_to_hf.py"),
        (convert_from_hf_main, hf_dir, "convert_from_hf.py"),
    ):
        assert main(["--input", str(source), "--output", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err  # progress bars, then one line
        name = "model.pt" if source == ckpt else "model.safetensors"
        assert "Traceback" not in err and err.endswith("restore it from a copy or re-create it\n"), err
        assert err.splitlines()[-1].startswith(f"{prog}: error: {source / name} cannot be read, truncated"), (
            err
        )
    with pytest.raises(CorruptFileError, match=r"model\.pt cannot be read, truncated"):
        load_model(ckpt)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_converted_folders_follow_the_umask(tmp_path, tokenizer_file, umask):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="nope")
    old = os.umask(umask)
    try:
        outputs = [convert_to_hf(ckpt, tmp_path / "hf")]
        outputs.append(convert_from_hf(outputs[0], tmp_path / "back"))
    finally:
        os.umask(old)
    for out in outputs:
        assert out.stat().st_mode & 0o777 == 0o777 & ~umask, out
        for file in out.iterdir():
            assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file


# ------------------------------------------------------------------------------------------- lm-eval

TASKS = ROOT / "olmo_repo" / "eval" / "lm_eval_tasks"


@pytest.mark.slow
def test_converted_model_runs_under_lm_eval(tmp_path, tokenizer_file):
    """The README's lm-eval command (HF backend, remote code) on the tiny offline tasks; the multiple-choice
    accuracy it reports is the one the OLMo model gives by summing the choices' log-probabilities."""
    pytest.importorskip("lm_eval", reason="install the `eval` extra")
    ckpt, olmo = make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1)
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    command = [
        *(sys.executable, "-m", "lm_eval", "--model", "hf"),
        *("--model_args", f"pretrained={hf_dir},trust_remote_code=True,dtype=float32"),
        *("--tasks", "repo_tiny_mc,repo_tiny_gen", "--include_path", str(TASKS)),
        *(
            "--device",
            "cpu",
            "--batch_size",
            "4",
            "--output_path",
            str(tmp_path / "results"),
            "--log_samples",
        ),
    ]
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules")
    )
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (results_file,) = (tmp_path / "results").rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]

    tok = Tokenizer.from_file(str(tokenizer_file))
    docs = [json.loads(line) for line in (TASKS / "repo_tiny.jsonl").read_text().splitlines()]
    correct = 0
    for doc in docs:
        scores = []
        for choice in doc["choices"]:
            n_ctx = len(tok.encode(doc["context"]).ids)
            ids = torch.tensor([tok.encode(doc["context"] + choice).ids])
            with torch.no_grad():
                logprobs = olmo(ids).logits.log_softmax(-1)[0, n_ctx - 1 : -1]
            scores.append(logprobs.gather(-1, ids[0, n_ctx:, None]).sum().item())
        correct += max(range(len(scores)), key=scores.__getitem__) == doc["answer"]
    assert results["repo_tiny_mc"]["acc,none"] == pytest.approx(correct / len(docs))

    # The generation task: each continuation is the OLMo model's greedy one (8 tokens at most, cut at the
    # task's stop strings), and the score is the share of exact matches.
    (samples_file,) = (tmp_path / "results").rglob("samples_repo_tiny_gen_*.jsonl")
    samples = sorted(
        (json.loads(line) for line in samples_file.read_text().splitlines()), key=lambda r: r["doc_id"]
    )
    assert len(samples) == len(docs)
    matches = []
    for sample, doc in zip(samples, docs, strict=True):
        ids = tok.encode(doc["context"]).ids
        for _ in range(8):
            with torch.no_grad():
                token = olmo(torch.tensor([ids])).logits[0, -1].argmax().item()
            if token == EOS:
                break
            ids.append(token)
        text = tok.decode(ids[len(tok.encode(doc["context"]).ids) :])
        text = re.split(r"[\n.]", text)[0]
        assert sample["resps"][0][0].split("\n")[0].split(".")[0] == text, sample["doc_id"]
        strip = lambda t: t.lower().translate(str.maketrans("", "", string.punctuation))  # noqa: E731
        matches.append(strip(text) == strip(doc["choices"][doc["answer"]]))
    assert results["repo_tiny_gen"]["exact_match,none"] == pytest.approx(sum(matches) / len(matches))


def test_tied_embeddings_and_bf16(tmp_path, tokenizer_file):
    ckpt, olmo = make_checkpoint(
        tmp_path / "olmo", tokenizer_file, weight_tying=True, pe_mode="repo", pe_start_layer=2
    )
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    ids = _ids()
    with torch.no_grad():
        _assert_same_logits(hf(ids).logits, olmo, ids, "tied-embedding HF logits")
    restored = torch.load(convert_from_hf(hf_dir, tmp_path / "back") / "model.pt", weights_only=True)
    original = olmo.state_dict()
    assert restored.keys() == original.keys() and all(torch.equal(restored[k], original[k]) for k in original)
    # bf16 weights: positions still come out in fp32 (f_phi accumulates and returns fp32; angles are fp32).
    bf16 = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        out = bf16(ids, output_positions=True)
        reference = hf(ids, output_positions=True)
    assert out.logits.dtype == torch.bfloat16 and all(
        z.dtype == torch.float32 for z in out.positions.values()
    )
    assert (out.logits.float() - reference.logits).abs().max() < 0.1


def test_as_hf_dir_takes_hf_dirs_as_they_are_and_converts_olmo_checkpoints(tmp_path, tokenizer_file):
    ckpt, model = make_checkpoint(tmp_path / "olmo", tokenizer_file, **MODES["repo"])
    with as_hf_dir(ckpt) as converted:
        assert converted.parent != ckpt.parent and (converted / "config.json").is_file()
        hf = AutoModelForCausalLM.from_pretrained(converted).eval()
        ids = _ids()
        with torch.no_grad():
            _assert_same_logits(hf(ids).logits, model, ids)
        with as_hf_dir(converted) as same:
            assert same == converted
    assert not converted.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["olmo"]
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        with as_hf_dir(tmp_path):
            pass


@pytest.mark.parametrize("stored, n_kv", [(4, 2), (2, 4)])
def test_a_checkpoint_whose_f_phi_does_not_fit_its_config_is_refused_in_one_line(
    tmp_path, tokenizer_file, stored, n_kv
):
    """final_map of a multi-head model in a directory whose config says grouped (and the other way round):
    every reader of an HF directory names the weight and the sizes in one line, and writes nothing."""
    make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode="repo", pe_start_layer=1, n_kv_heads=stored)
    hf_dir = convert_to_hf(tmp_path / "olmo", tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "num_key_value_heads": n_kv}))
    message = rf"^{re.escape(str(hf_dir))}: model\.layers\.1\.self_attn\.final_map\.weight predicts {stored} positions per token, but this model has {n_kv} key/value heads"
    for load in (
        lambda: read_hf_config(hf_dir),
        lambda: convert_from_hf(hf_dir, tmp_path / "back"),
        lambda: convert_to_hf(hf_dir, tmp_path / "again"),
    ):
        with pytest.raises(ValueError, match=message) as error:
            load()
        assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "olmo"]


@pytest.mark.parametrize(
    "pe_mode, key, says",
    [
        ("repo", "pe_mdoe", "did you mean 'pe_mode'?"),  # RePo weights give it away
        ("rope", "pe_mdoe", "did you mean 'pe_mode'?"),  # `pe_mode: nope` misspelt: no weight says so
        ("repo", "pe_start", "did you mean 'pe_start_layer'?"),
    ],
)
def test_a_misspelt_position_key_is_refused_naming_the_nearest(tmp_path, tokenizer_file, pe_mode, key, says):
    """A config.json whose position-mode key is misspelt read as all-RoPE, the RePo weights dropped: every
    reader of an HF directory refuses it in one line naming the key and its nearest known name."""
    extra = {"pe_start_layer": 1} if pe_mode == "repo" else {}
    make_checkpoint(tmp_path / "olmo", tokenizer_file, pe_mode=pe_mode, **extra)
    hf_dir = convert_to_hf(tmp_path / "olmo", tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    real = {"pe_mdoe": "pe_mode", "pe_start": "pe_start_layer"}[key]
    config[key] = config.pop(real, "nope")
    (hf_dir / "config.json").write_text(json.dumps(config))
    message = rf"^{re.escape(str(hf_dir))}/config\.json: unknown key '{key}'; {re.escape(says)}$"
    from olmo_repo.eval.loading import load_model  # scripts/eval.py's, the report's, the analyses' loader

    readers = (read_hf_config, lambda d: convert_from_hf(d, tmp_path / "back"), lambda d: load_model(d, 64))
    for load in (lambda reader=reader: reader(hf_dir) for reader in readers):
        with pytest.raises(ValueError, match=message):
            load()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "olmo"]


# ------------------------------------------------------------------------- reruns lose and change nothing

_KILLED_BEFORE_THE_REPLACE = """
import os, signal, sys
import olmo_repo.output
# Every file of the new output is staged; the kill comes before it replaces the old one.
olmo_repo.output._apply_umask = lambda root: os.kill(os.getpid(), signal.SIGKILL)
from olmo_repo.cli.{command} import main
sys.exit(main(sys.argv[1:]))
"""


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """{name: (bytes, mtime in ns)} of every file under `root`."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}  # fmt: skip


def _contents(root: Path) -> dict[str, bytes]:
    return {name: data for name, (data, _) in _tree(root).items()}


@pytest.mark.slow  # a killed conversion in a process of its own
@pytest.mark.parametrize("command", ["convert_to_hf", "convert_from_hf"])
def test_a_conversion_rerun_changes_nothing_and_a_killed_one_leaves_the_output_as_before(
    tmp_path, tokenizer_file, capsys, command
):
    ckpt, _ = make_checkpoint(tmp_path / "olmo", tokenizer_file, **MODES["repo"])
    source = ckpt if command == "convert_to_hf" else convert_to_hf(ckpt, tmp_path / "hf")
    main = convert_to_hf_main if command == "convert_to_hf" else convert_from_hf_main
    out = tmp_path / "out"
    args = ["--input", str(source), "--output", str(out)]
    assert main(args) == 0
    first = _tree(out)
    capsys.readouterr()

    assert main(args) == 1  # without --force: refused in one line, the folder untouched
    assert capsys.readouterr().err == f"{command}.py: error: {out} exists; pass --force to replace it\n"
    assert _tree(out) == first
    assert main([*args, "--force"]) == 0  # the same bytes again
    assert _contents(out) == {k: v for k, (v, _) in first.items()}

    before = _tree(out)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_BEFORE_THE_REPLACE.format(command=command), *args, "--force"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _tree(out) == before  # the output as before, every byte and timestamp
    assert main([*args, "--force"]) == 0  # and a rerun completes it as one clean run does
    assert _contents(out) == {k: v for k, (v, _) in first.items()}
    # What is left beside the output: the inputs, and the staging folder the kill left (hidden, never `out`).
    left = {p.name for p in tmp_path.iterdir() if not p.name.startswith(".out.partial-")}
    assert left == {"olmo", "out"} | ({"hf"} if command == "convert_from_hf" else set())


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"model_type": "olmo2",'])
def test_an_unreadable_config_json_is_named_in_one_line(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'config.json'))} is not ") as error:
        read_hf_config(tmp_path)
    assert "\n" not in str(error.value)


def test_round_trips_keep_every_config_value(converted, tmp_path):
    """ai2-olmo -> HF -> ai2-olmo -> HF: both configs come back whole, but for the keys tests/round_trips.py
    lists with their reasons (training length, RoPE, norms, position modes all kept)."""
    from omegaconf import OmegaConf

    from .round_trips import HF_MAY_DIFFER, OLMO_MAY_DIFFER, config_differences

    _, _, hf_dir = converted
    back = convert_from_hf(hf_dir, tmp_path / "back")
    hf_again = convert_to_hf(back, tmp_path / "hf-again")
    hf_configs = [json.loads((d / "config.json").read_text()) for d in (hf_dir, hf_again)]
    assert config_differences(*hf_configs, HF_MAY_DIFFER) == {}
    models = [
        OmegaConf.to_container(OmegaConf.load(d / "config.yaml").model) for d in (tmp_path / "olmo", back)
    ]
    assert config_differences(*models, OLMO_MAY_DIFFER) == {}
    widths = [m["mlp_hidden_size"] or m["mlp_ratio"] * m["d_model"] for m in models]
    assert widths[0] == widths[1]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_ai2_olmo_converter_sends_llama_and_qwen3_to_olmo_core(tmp_path, capsys, family):
    """The ai2-olmo trainer stays the OLMo 2 recipe's: a Llama or Qwen 3 directory is refused in one line that
    names the OLMo-core converter, nothing written."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=64, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # save_pretrained's progress bar
    assert convert_from_hf_main(["--input", str(tmp_path / "hf"), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"convert_from_hf.py: error: {tmp_path / 'hf'}: model_type='{family}' is not supported; allowed: olmo2, "
        "repo_olmo2, olmo3, repo_olmo3 (Llama and Qwen 3 train with OLMo-core: scripts/core_convert_from_hf.py "
        "converts them)\n"
    )
    assert not (tmp_path / "out").exists()
