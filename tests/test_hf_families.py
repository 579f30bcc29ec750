"""Hugging Face `repo_llama` and `repo_qwen3`: transformers' Llama and Qwen 3 with the RePo attention.

Tiny random fp32 models built from transformers' own `LlamaConfig` / `Qwen3Config`, checked against a float64
forward written here from the design alone (no package code for the math), against the stock models, through
the KV cache, through `save_pretrained` / the Auto classes, and as remote code with `olmo_repo` blocked.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from torch import Tensor
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import olmo_repo.hf  # noqa: F401  (registers repo_llama and repo_qwen3 with the Auto classes)
from olmo_repo.hf import (
    RepoCausalLMOutputWithPast,
    RepoLlamaConfig,
    RepoLlamaForCausalLM,
    RepoModelOutputWithPast,
    RepoQwen3Config,
    RepoQwen3ForCausalLM,
)
from olmo_repo.hf.files import save_hf

from .bounds import assert_within

FAMILIES = {  # family -> (stock config, stock causal LM, RePo config, RePo causal LM)
    "llama": (LlamaConfig, LlamaForCausalLM, RepoLlamaConfig, RepoLlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, RepoQwen3Config, RepoQwen3ForCausalLM),
}
VOCAB = 128
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.125,  # ~ 1 / sqrt(hidden_size): attention scores of order 1, not a flat softmax
    rms_norm_eps=1e-6,
)
# head_dim 16, theta 1e4: wavelengths of 6 to 2e4 tokens, so that each of llama3's three bands has some.
LLAMA3 = dict(
    rope_type="llama3",
    rope_theta=10_000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=256,
)
F_PHI = ("gate_map", "content_map", "final_map")
REPO = dict(pe_mode="repo", pe_start_layer=1)
CASES = {  # name -> (family, config overrides, position keys)
    "llama-gqa": ("llama", {}, REPO),
    "llama-mqa-bias-tied": ("llama", dict(num_key_value_heads=1, attention_bias=True, tie_word_embeddings=True), REPO),
    "llama-llama3": ("llama", dict(rope_parameters=LLAMA3, max_position_embeddings=2048), REPO),
    "llama-nope-hybrid": ("llama", {}, dict(pe_mode="nope", pe_layer_ids=[0, 2])),
    "qwen3-gqa-head-dim-24": ("qwen3", dict(head_dim=24), REPO),
    "qwen3-mqa-bias-tied": ("qwen3", dict(num_key_value_heads=1, attention_bias=True, tie_word_embeddings=True), REPO),
    "qwen3-sliding": ("qwen3", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1), REPO),
}  # fmt: skip


def _kwargs(family: str, **overrides) -> dict:
    """BASE with `overrides`; Qwen 3's head_dim 16 unless overridden (Qwen3Config's default is 128)."""
    return {**BASE, **({"head_dim": 16} if family == "qwen3" else {}), **overrides}


def _randomise(model: torch.nn.Module) -> None:
    """Norm weights around 1 (not all 1: a q/k norm would then commute with the rotation), random biases, and
    f_phi weights wide enough that positions span tens of tokens (transformers' init predicts ~1e-3)."""
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.uniform_(param, 0.5, 1.5)
        elif name.endswith(".bias"):
            torch.nn.init.normal_(param, std=0.1)
        elif name.split(".")[-2] in F_PHI:
            torch.nn.init.normal_(param, std=0.5)


def _repo_model(family: str, overrides: dict, pe: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    model = FAMILIES[family][3](FAMILIES[family][2](**_kwargs(family, **overrides, **pe))).eval()
    _randomise(model)
    return model


# ------------------------------------------------------------------------------- the design, by hand in float64


def _inv_freq(config) -> Tensor:
    """theta^(-2k/d) for k < d/2; Llama 3's: wavelengths longer than original / low_freq_factor interpolated
    (frequency / factor), shorter than original / high_freq_factor kept, a linear blend in the number of turns
    over the original context between."""
    rope, d = config.rope_parameters, config.head_dim
    freq = rope["rope_theta"] ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    if rope.get("rope_type", "default") == "llama3":
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        turns = rope["original_max_position_embeddings"] * freq / (2 * math.pi)
        keep = ((turns - low) / (high - low)).clamp(0, 1)
        freq = keep * freq + (1 - keep) * freq / rope["factor"]
    return freq


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def _rotate(x: Tensor, z: Tensor, inv_freq: Tensor) -> Tensor:
    """x [B, T, heads, d] by real positions z [B, T, heads]: pair (k, k + d/2) turned by z * inv_freq_k."""
    angle = z[..., None] * inv_freq
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), dim=-1)


def _mode(config, layer: int) -> str:
    """The pe_* rule: pe_mode for layers >= pe_start_layer (and in pe_layer_ids if set), RoPE elsewhere."""
    ids = config.pe_layer_ids
    selected = layer >= config.pe_start_layer and (ids is None or layer in ids)
    return config.pe_mode if selected else "rope"


def _by_hand(model, ids: Tensor, integer_positions: bool = False) -> tuple[Tensor, dict[int, Tensor]]:
    """(logits, {RePo layer: positions [B, H_kv, T]}) of a pre-norm Llama / Qwen 3 decoder in float64.
    `integer_positions`: RePo layers rotate by 0..T-1 instead (to show that their positions matter)."""
    c = model.config
    w = {name: p.detach().double() for name, p in model.named_parameters()}
    B, T = ids.shape
    H, H_kv, hd, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    group, inv_freq = H // H_kv, _inv_freq(c)
    positions = {}

    def linear(name: str, x: Tensor) -> Tensor:
        y = x @ w[f"{name}.weight"].T
        return y + w[f"{name}.bias"] if f"{name}.bias" in w else y

    x = w["model.embed_tokens.weight"][ids]
    for i in range(c.num_hidden_layers):
        a = f"model.layers.{i}.self_attn"
        h = _rms(x, w[f"model.layers.{i}.input_layernorm.weight"], eps)  # what q, k, v and f_phi read
        q = linear(f"{a}.q_proj", h).view(B, T, H, hd)
        k = linear(f"{a}.k_proj", h).view(B, T, H_kv, hd)
        v = linear(f"{a}.v_proj", h).view(B, T, H_kv, hd)
        if f"{a}.q_norm.weight" in w:  # Qwen 3: per head, before the rotation
            q, k = _rms(q, w[f"{a}.q_norm.weight"], eps), _rms(k, w[f"{a}.k_norm.weight"], eps)
        mode = _mode(c, i)
        z = torch.arange(T, dtype=torch.float64).expand(B, H_kv, T).transpose(1, 2)  # [B, T, H_kv]
        if mode == "repo" and not integer_positions:
            z = linear(f"{a}.final_map", F.silu(linear(f"{a}.gate_map", h)) * linear(f"{a}.content_map", h))
            positions[i] = z.transpose(1, 2)
        if mode != "nope":  # query head j shares the position of key/value head j // group
            q, k = _rotate(q, z.repeat_interleave(group, dim=-1), inv_freq), _rotate(k, z, inv_freq)
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(hd)
        query, key = torch.arange(T)[:, None], torch.arange(T)[None, :]
        visible = key <= query
        if getattr(c, "layer_types", None) and c.layer_types[i] == "sliding_attention":
            visible &= query - key < c.sliding_window
        attended = torch.einsum("bhij,bjhd->bihd", scores.masked_fill(~visible, -math.inf).softmax(-1), v)
        x = x + linear(f"{a}.o_proj", attended.reshape(B, T, H * hd))
        h = _rms(x, w[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        m = f"model.layers.{i}.mlp"
        x = x + linear(f"{m}.down_proj", F.silu(linear(f"{m}.gate_proj", h)) * linear(f"{m}.up_proj", h))
    x = _rms(x, w["model.norm.weight"], eps)
    return x @ model.lm_head.weight.detach().double().T, positions


def _roundings(config, T: int, positions: dict[int, Tensor]) -> float:
    """Worst-case rounding count of fp32 logits, in eps x max|logit| (tests/bounds.py): per layer the reduction
    lengths along it (two RMSNorms, the q/k/v, f_phi and MLP input projections over d_model; the q/k norms and
    scores over head_dim; final_map over d_model / 8; the weighted sum over T; o_proj over H x head_dim;
    down_proj over the MLP's width) plus the rotation: an angle z f is off by the rounding of z (f_phi's
    reductions, d_model + d_model / 8, relative to |z|) and of the product, in units of |z| f_max, and cos,
    sin and the pair's products add 5. Times the layers, then the final norm and lm_head over d_model."""
    d, hd, H = config.hidden_size, config.head_dim, config.num_attention_heads
    z_max = max([T - 1.0, *(z.abs().max().item() for z in positions.values())])
    rotation = (d + d // 8 + 1) * z_max * _inv_freq(config).max().item() + 5
    layer = 8 * d + 2 * hd + d // 8 + T + H * hd + config.intermediate_size + rotation
    return config.num_hidden_layers * layer + 2 * d


@pytest.mark.parametrize("case", list(CASES))
def test_repo_forward_is_the_design_computed_by_hand_in_float64(case):
    family, overrides, pe = CASES[case]
    model = _repo_model(family, overrides, pe)
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        out = model(ids, output_positions=True)
    truth, positions = _by_hand(model, ids)
    roundings = _roundings(model.config, ids.shape[1], positions)
    bound = roundings * torch.finfo(torch.float32).eps * truth.abs().max().item()
    print(f"\n{case}: max |logits - float64| {(out.logits - truth).abs().max():.3g}, bound {bound:.3g}")
    assert_within(out.logits, truth, roundings=roundings, what=f"{case} logits")
    assert sorted(out.positions) == sorted(positions)
    # every family's outputs are the shared stock ones plus `positions`
    assert type(out) is RepoCausalLMOutputWithPast
    assert type(model.model(ids, output_positions=True)) is RepoModelOutputWithPast
    for layer, z in positions.items():
        assert out.positions[layer].shape == (2, model.config.num_key_value_heads, 16)
        assert_within(out.positions[layer], z, roundings=roundings, what=f"{case} positions of layer {layer}")
    if positions:  # the test can see the positions: rotating the RePo layers by 0..T-1 misses by far
        assert max(z.abs().max() for z in positions.values()) > 10
        assert (_by_hand(model, ids, integer_positions=True)[0] - truth).abs().max() > 100 * bound
    if "rope_parameters" in overrides:  # llama3 scaling changes the frequencies (of every layer)
        default = RepoLlamaConfig(**{**BASE, **pe})
        assert (_inv_freq(model.config) - _inv_freq(default)).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------ the KV cache


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-sliding"])
def test_generate_with_cache_equals_without(case):
    family, overrides, pe = CASES[case]
    model = _repo_model(family, overrides, pe)
    prompt = torch.randint(0, VOCAB, (2, 8))
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    cached = model.generate(prompt, use_cache=True, **kwargs)
    assert cached.shape == (2, 24)
    assert torch.equal(cached, model.generate(prompt, use_cache=False, **kwargs))
    with torch.no_grad():  # incremental decoding reproduces the full forward's logits
        full = model(cached, output_positions=True)
        out = model(cached[:, :10], use_cache=True)
        pieces, cache = [out.logits], out.cache
        for t in range(10, cached.shape[1]):
            out = model(cached[:, t : t + 1], cache=cache, use_cache=True)
            pieces.append(out.logits)
            cache = out.cache
    roundings = 2 * _roundings(model.config, cached.shape[1], full.positions)  # two fp32 results
    assert_within(torch.cat(pieces, dim=1), full.logits, roundings=roundings, what=f"{case} cached decoding")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_attention_function_gets_the_stock_sliding_window(family, monkeypatch):
    """Qwen 3's sliding-window layers pass their window to the attention function (flash attention reads it),
    full-attention layers and Llama pass None, exactly as the stock forwards do."""
    overrides = CASES["qwen3-sliding"][1] if family == "qwen3" else {}
    stock = FAMILIES[family][1](FAMILIES[family][0](**_kwargs(family, **overrides))).eval()
    repo = _repo_model(family, overrides, dict(pe_mode="repo", pe_start_layer=0))
    calls = []
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def recording(module, *args, **kwargs):
        calls.append((type(module).__name__, module.layer_idx, kwargs.get("sliding_window")))
        return sdpa(module, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", recording)
    ids = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        stock(ids)
        stock_calls = calls.copy()
        calls.clear()
        repo(ids)
    assert [c[1:] for c in calls] == [c[1:] for c in stock_calls]
    assert all(name.startswith("Repo") for name, _, _ in calls)
    windows = [window for _, _, window in calls]
    assert windows == ([None, 5, 5] if family == "qwen3" else [None] * 3)


# -------------------------------------------------------------------------------------------- stock weights


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_stock_weights_give_the_stock_logits_and_repo_adds_only_f_phi(family, tied):
    stock_config, stock_lm, repo_config, repo_lm = FAMILIES[family]
    torch.manual_seed(0)
    stock = stock_lm(stock_config(**_kwargs(family, tie_word_embeddings=tied))).eval()
    _randomise(stock)
    rope = repo_lm(repo_config(**_kwargs(family, tie_word_embeddings=tied, pe_mode="rope"))).eval()
    rope.load_state_dict(stock.state_dict())  # strict
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        assert torch.equal(rope(ids).logits, stock(ids).logits)
    repo = repo_lm(repo_config(**_kwargs(family, tie_word_embeddings=tied, **REPO)))
    f_phi = {f"model.layers.{i}.self_attn.{name}.weight" for i in (1, 2) for name in F_PHI}
    assert set(repo.state_dict()) == set(stock.state_dict()) | f_phi
    missing, unexpected = repo.load_state_dict(stock.state_dict(), strict=False)
    assert set(missing) == f_phi and not unexpected
    assert (repo.lm_head.weight is repo.model.embed_tokens.weight) == tied


# --------------------------------------------------------------------------------------------- saved models


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-mqa-bias-tied"])
def test_save_pretrained_loads_through_the_auto_classes(case, tmp_path):
    family, overrides, pe = CASES[case]
    model = _repo_model(family, overrides, pe)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is FAMILIES[family][3]
    assert loaded.config.pe_mode == "repo" and loaded.config.pe_start_layer == 1
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == model.config.tie_word_embeddings
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


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
from transformers import AutoModelForCausalLM
ids = torch.load(sys.argv[1])
logits = {}
for hf_dir in sys.argv[2:]:
    model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    with torch.no_grad():
        logits[hf_dir] = model(ids).logits
torch.save(logits, sys.argv[1] + ".out")
try:
    import olmo_repo
except ImportError:
    pass
else:
    raise SystemExit("olmo_repo was importable")
"""


@pytest.mark.slow  # a process of its own, which imports transformers and torch again
def test_remote_code_written_by_save_hf_loads_with_only_transformers(tmp_path):
    """Both families in one process: the project's writer copies each model's remote code (its files and the
    mixins', rules' and RePo layer's it imports) beside the weights, and transformers alone runs them."""
    ids = torch.randint(0, VOCAB, (2, 12))
    torch.save(ids, tmp_path / "ids.pt")
    dirs, expected = [], {}
    for case in ("llama-llama3", "qwen3-mqa-bias-tied"):
        family, overrides, pe = CASES[case]
        model = _repo_model(family, overrides, pe)
        out = tmp_path / case
        out.mkdir()
        tied = model.config.tie_word_embeddings  # save_hf takes a tied model's weights without lm_head
        state_dict = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_hf(copy.deepcopy(model.config), state_dict, out, None)
        assert {p.name for p in out.glob("*.py")} == {
            f"configuration_repo_{family}.py", f"modeling_repo_{family}.py", "configuration_repo_olmo2.py",
            "modeling_repo_olmo2.py", "rope.py", "rotation.py", "modes.py",
        }  # fmt: skip
        with torch.no_grad():
            expected[str(out)] = model(ids).logits
        dirs.append(str(out))
    script = tmp_path / "load.py"
    script.write_text(_BLOCKER + _REMOTE_LOAD)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ids.pt"), *dirs], check=True, cwd=tmp_path, env=env
    )
    got = torch.load(tmp_path / "ids.pt.out")
    for hf_dir, logits in expected.items():
        assert torch.equal(got[hf_dir], logits), hf_dir


# ------------------------------------------------------------------------------------------------ bad values


def _rope(rope_type: str) -> dict:
    return dict(rope_type=rope_type, rope_theta=1e4, factor=2.0, original_max_position_embeddings=32)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "keys, key, says",
    [
        (dict(pe_mode="repo", pe_start_layer=3), "pe_start_layer", "=3 is out of range: allowed 0..2"),
        (dict(pe_mode="repos"), "pe_mode", "='repos' is not supported; allowed: rope, nope, repo"),
        (dict(pe_mode="nope", pe_layer_ids=[1, 5]), "pe_layer_ids", r" has layer ids \[5\] out of range"),
        (dict(pe_mode="repo", rope_parameters=_rope("dynamic")), "rope_parameters.rope_type", "='dynamic'"),
        (
            dict(
                pe_mode="repo",
                rope_parameters={**_rope("longrope"), "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
            ),
            "rope_parameters.rope_type",
            "='longrope' cannot rotate RePo positions; allowed with pe_mode='repo': default, linear, yarn, llama3",
        ),
    ],
    ids=["start", "mode", "layer-ids", "dynamic-rope", "longrope"],
)
def test_a_bad_position_value_is_one_error_naming_the_key(family, keys, key, says):
    """On construction (`@strict`: its error wraps the one ValueError) and from `validate_position_modes`."""
    config_class = FAMILIES[family][2]
    with pytest.raises(StrictDataclassError, match=key.replace(".", r"\.") + says) as raised:
        config_class(**_kwargs(family, **keys))
    cause = raised.value.__cause__
    assert isinstance(cause, ValueError) and str(cause).startswith(key)
    llama3 = dict(rope_parameters=LLAMA3, max_position_embeddings=2048)  # llama3 frequencies may rotate RePo
    config = config_class(**_kwargs(family, **REPO, **llama3))
    for name, value in keys.items():
        setattr(config, name, value)
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + says):
        config.validate_position_modes()
