"""Everything downstream of the models takes Llama and Qwen 3, stock and RePo, as it takes OLMo: `scripts/eval.py`
(NIAH, YaRN past the training length, Llama 3's own scaling left alone), the attention mass, the position analyses
with `scripts/plot_positions.py`, the explorer's model, and the FLOPs count with `scripts/flops.py`.

Tiny random fp32 models from transformers' own `LlamaConfig` / `Qwen3Config` and the project's `RepoLlamaConfig` /
`RepoQwen3Config`, grouped-query attention (4 query heads, 2 key/value heads), RePo layers 1 and 2, saved with
the project's HF save path (`save_hf`). Ground truth: transformers' own attention weights (`output_attentions`),
f_phi applied by hand to the attention's input (`output_hidden_states`), YaRN's published frequencies and
temperature, the parameters that the safetensors files hold, ai2-olmo's count of the same OLMo model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    LlamaConfig,
    Olmo2Config,
    PreTrainedTokenizerFast,
    Qwen3Config,
)

from olmo_repo.cli.eval import main as eval_main
from olmo_repo.cli.flops import main as flops_main
from olmo_repo.cli.plot_positions import main as plot_main
from olmo_repo.eval import niah
from olmo_repo.eval.attention import attention_mass, token_groups
from olmo_repo.eval.loading import load_model, read_config, training_length, yarn_overrides
from olmo_repo.eval.positions import patterns_by_layer, position_patterns, spans_by_length, text_positions
from olmo_repo.explore.model import BadRequest, ExplorerModel
from olmo_repo.flops import hf_parameter_count, parameter_count
from olmo_repo.hf import RepoLlamaConfig, RepoQwen3Config, attention_modules
from olmo_repo.hf.files import MODEL_CLASSES, save_hf
from olmo_repo.hf.formats import weight_shapes
from olmo_repo.modes import F_PHI_WEIGHTS

from .conftest import EOS, PAD, VOCAB, make_checkpoint

TRAINED = 768  # max_position_embeddings: the training length evaluation reads
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: two query heads per key/value head
    max_position_embeddings=TRAINED,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    initializer_range=0.125,  # attention scores of order 1: rows far from uniform
    bos_token_id=None,
    eos_token_id=EOS,
    pad_token_id=PAD,
)
REPO = dict(pe_mode="repo", pe_start_layer=1)  # layer 0 RoPE, layers 1 and 2 RePo
FAMILIES = {  # name -> (config class, keys)
    "llama": (LlamaConfig, {}),
    "qwen3": (Qwen3Config, dict(head_dim=16)),
    "repo_llama": (RepoLlamaConfig, REPO),
    "repo_qwen3": (RepoQwen3Config, dict(head_dim=16, **REPO)),
}
REPO_FAMILIES = ["repo_llama", "repo_qwen3"]
TEXT = "RePo moves tokens: the cat sat on the mat, then it slept. " * 3


def save(path: Path, tokenizer: PreTrainedTokenizerFast, name: str, **overrides) -> Path:
    """A tiny random model of family `name` in `path`, written by the project's HF save path; f_phi's weights
    spread so that positions reach a few units (a rotation that mattered would show)."""
    config_class, keys = FAMILIES[name]
    config = config_class(**{**BASE, **keys, **overrides})
    torch.manual_seed(0)
    model = MODEL_CLASSES[config_class](config)
    with torch.no_grad():
        for attention in attention_modules(model):
            for weight in F_PHI_WEIGHTS:
                if hasattr(attention, weight):
                    torch.nn.init.normal_(getattr(attention, weight).weight, std=0.5)
    path.mkdir(parents=True)
    save_hf(config, model.state_dict(), path, None)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), eos_token="<eos>", pad_token="<pad>")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: save(root / name, tokenizer, name) for name in FAMILIES}


def one_error_line(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    return err


# ------------------------------------------------------------------------------------ scripts/eval.py


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_eval_cli_takes_the_family(tmp_path, dirs, name):
    """NIAH at the training length and at 2x with YaRN (factor 2 from 768), each sample scored as recorded."""
    out = tmp_path / "out"
    args = [
        str(dirs[name]),
        "--tasks",
        "niah_single_1",
        "--lengths",
        f"{TRAINED},{2 * TRAINED}",
        "--samples",
        "1",
    ]
    assert eval_main([*args, "--batch-size", "1", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["training_length"] == TRAINED
    assert results["lengths"][str(TRAINED)] == {
        "yarn_factor": None,
        "rope_parameters": BASE["rope_parameters"],
    }
    yarn = results["lengths"][str(2 * TRAINED)]
    assert yarn["yarn_factor"] == 2.0
    assert yarn["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": 10_000.0, "factor": 2.0, "original_max_position_embeddings": TRAINED,
    }  # fmt: skip
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["length"]) for r in records] == [
        ("niah_single_1", TRAINED),
        ("niah_single_1", 2 * TRAINED),
    ]
    for r in records:
        assert r["score"] == niah.score(r["output"], r["answers"])
        assert results["scores"]["niah_single_1"][str(r["length"])] == r["score"]


@pytest.mark.parametrize("name", REPO_FAMILIES)
def test_yarn_reaches_the_repo_positions(dirs, name):
    """Past the training length every RePo layer rotates its positions with YaRN's frequencies and temperature
    (head_dim 16, theta 1e4, factor 2 over 768: the fastest frequency turns 122 times in 768 tokens, more than
    beta_fast = 32, and is kept; the slowest turns 0.04 times, fewer than beta_slow = 1, and is divided by the
    factor; the temperature is 0.1 ln 2 + 1), as the RoPE layer does; within it they are the model's own."""
    plain, scaled = load_model(dirs[name], TRAINED), load_model(dirs[name], 2 * TRAINED)
    theta = 10_000.0 ** (
        -torch.arange(0, 16, 2, dtype=torch.float64) / 16
    )  # [8] unscaled inverse frequencies
    repo_layers = [a for a in attention_modules(scaled) if hasattr(a, "final_map")]
    assert len(repo_layers) == 2
    for attention in repo_layers:
        inv_freq, factor = attention.rope_frequencies("cpu")
        assert factor == pytest.approx(0.1 * math.log(2) + 1)
        assert inv_freq[0].item() == pytest.approx(theta[0].item())
        assert inv_freq[-1].item() == pytest.approx(theta[-1].item() / 2)
        torch.testing.assert_close(inv_freq, scaled.model.rotary_emb.inv_freq)  # the RoPE layer's
    for attention in attention_modules(plain)[1:]:
        inv_freq, factor = attention.rope_frequencies("cpu")
        assert factor == 1.0
        torch.testing.assert_close(inv_freq.double(), theta)
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        assert (plain(ids).logits - scaled(ids).logits).abs().max() > 1e-3


def test_llama3_scaling_is_kept_and_yarn_never_stacked_on_it(tmp_path, tokenizer, capsys):
    """A Llama 3-scaled model (llama3 RoPE from 256 out to 2048) is trained at 2048: evaluated as it is up to there;
    past it YaRN would replace its scaling, so that is refused in one line before anything loads or is written,
    and `--yarn off` runs it with its own. A YaRN model is rescaled from its original length."""
    llama3 = dict(rope_type="llama3", rope_theta=10_000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=256)  # fmt: skip
    path = save(
        tmp_path / "llama3", tokenizer, "repo_llama", rope_parameters=llama3, max_position_embeddings=2048
    )
    config = read_config(path)
    assert training_length(config) == 2048
    assert yarn_overrides(config, 2048) == {} and yarn_overrides(config, 4096, "off") == {}
    assert load_model(path, 2048).config.rope_parameters == llama3
    out = tmp_path / "out"
    capsys.readouterr()
    assert (
        eval_main([str(path), "--tasks", "niah_single_1", "--lengths", "2048,4096", "--out", str(out)]) == 1
    )
    err = one_error_line(capsys, "eval.py")
    assert f"{path}/config.json: rope_type='llama3'" in err and "--yarn off" in err
    assert not out.exists()

    yarn = dict(rope_type="yarn", rope_theta=10_000.0, factor=4.0, original_max_position_embeddings=256)
    path = save(tmp_path / "yarn", tokenizer, "qwen3", rope_parameters=yarn, max_position_embeddings=1024)
    config = read_config(path)
    assert training_length(config) == 256
    assert yarn_overrides(config, 512)["rope_parameters"] == {**yarn, "factor": 2.0}


# --------------------------------------------------------------------------------------- the analyses


def _transformers_attention_mass(model, tokenizer, sample: niah.NiahSample) -> torch.Tensor:
    """[L, 3]: the last text token's row of transformers' own eager attention weights (`output_attentions`), the
    query heads averaged, then the mean weight per token of needle, query and other tokens."""
    enc = tokenizer(sample.prompt, return_offsets_mapping=True)
    groups = token_groups(enc["offset_mapping"], sample.needle_spans, sample.query_span)  # [T]
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(torch.tensor([enc["input_ids"]]), output_attentions=True).attentions
    model.set_attn_implementation(previous)
    assert all(a.shape[1] == model.config.num_attention_heads for a in attentions)  # one row per query head
    rows = torch.stack([a[0, :, -1, :] for a in attentions]).double().mean(1)  # [L, H, T] -> [L, T]
    return torch.stack([rows[:, groups == g].mean(1) for g in range(3)], dim=1)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_attention_mass_is_transformers_own_weights(dirs, tokenizer, name):
    model = load_model(dirs[name], TRAINED)
    sample = niah.niah_samples(tokenizer, "niah_single_1", TRAINED, n=1, seed=1)[0]
    mass = attention_mass(model, tokenizer, sample.prompt, sample.needle_spans, sample.query_span)
    assert mass.repo_layers == ((1, 2) if name.startswith("repo_") else ())
    expected = _transformers_attention_mass(model, tokenizer, sample)
    assert mass.per_layer.shape == (3, 3)
    torch.testing.assert_close(mass.per_layer, expected, rtol=1e-6, atol=1e-9)
    assert model.config._attn_implementation != "eager"  # switched back


def _f_phi_positions(model, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """{RePo layer: [H_kv, T]} by the design: z = W_z (SiLU(W_g x) * (W_c x)) of the attention's input x, which
    for Llama and Qwen 3 (norm before each sublayer) is the layer's input_layernorm of its input."""
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states  # layer i's input: hidden[i] [1, T, d]
        out = {}
        for i, layer in enumerate(model.model.layers):
            a = layer.self_attn
            if hasattr(a, "final_map"):
                x = layer.input_layernorm(hidden[i])
                out[i] = a.final_map(F.silu(a.gate_map(x)) * a.content_map(x))[0].T  # [T, H_kv] -> [H_kv, T]
    return out


@pytest.mark.parametrize("name", REPO_FAMILIES)
def test_position_analyses_read_f_phis_positions(dirs, tokenizer, tmp_path, capsys, name):
    """`text_positions`, spans, patterns, the explorer's model and `scripts/plot_positions.py` on a RePo Llama /
    Qwen 3: one position per key/value head, those f_phi gives; a stock model is refused in one line."""
    model = load_model(dirs[name], TRAINED)
    ids = tokenizer(TEXT)["input_ids"]
    truth = _f_phi_positions(model, torch.tensor([ids]))  # {layer: [2, T]}
    assert sorted(truth) == [1, 2] and max(z.abs().max() for z in truth.values()) > 1  # spread positions
    positions, labels = text_positions(model, tokenizer, TEXT)
    assert "".join(labels) == TEXT
    assert sorted(positions) == [1, 2]
    for layer, z in truth.items():
        torch.testing.assert_close(positions[layer], z, rtol=1e-5, atol=1e-5)
    spans = spans_by_length(model, tokenizer, TEXT, [16, len(ids)])
    for n in (16, len(ids)):
        for layer, z in truth.items():
            torch.testing.assert_close(
                spans[n][layer].double(), (z[:, :n].amax(-1) - z[:, :n].amin(-1)).double()
            )
    patterns = patterns_by_layer({layer: z[None] for layer, z in positions.items()})
    assert patterns["all"] == position_patterns(torch.stack(list(positions.values())))

    explorer = ExplorerModel(dirs[name])
    assert (explorer.n_heads, explorer.n_query_heads, explorer.repo_layers) == (2, 4, [1, 2])
    shown = explorer.positions(TEXT)
    torch.testing.assert_close(
        torch.tensor(shown["positions"]), torch.stack([truth[1], truth[2]]), rtol=1e-5, atol=1e-5
    )

    png = tmp_path / "head.png"
    assert plot_main([str(dirs[name]), "--text", TEXT, "--layer", "2", "--head", "1", "--out", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    capsys.readouterr()
    stock = dirs[name.removeprefix("repo_")]
    assert plot_main([str(stock), "--text", TEXT, "--out", str(tmp_path / "stock.png")]) == 1
    assert "has no RePo layer" in one_error_line(capsys, "plot_positions.py")
    assert not (tmp_path / "stock.png").exists()
    with pytest.raises(BadRequest, match="no RePo layer"):
        ExplorerModel(stock).positions(TEXT)


# ---------------------------------------------------------------------------------------------- FLOPs


def test_flops_count_the_families_weights(dirs, capsys):
    """Every parameter in the file counted once; N without the input embedding; f_phi 2 layers x (2 x 64 x 8 + 8 x 2)
    (one final_map row per key/value head). A tied model counts its embedding once, as N leaves it out."""
    capsys.readouterr()
    for name, path in dirs.items():
        count = hf_parameter_count(read_config(path))
        shapes = weight_shapes(path)
        assert count.total == sum(math.prod(s) for s in shapes.values())
        assert count.non_embedding == count.total - VOCAB * 64
        assert count.repo == (2 * (2 * 64 * 8 + 8 * 2) if name.startswith("repo_") else 0)
        stock = hf_parameter_count(read_config(dirs[name.removeprefix("repo_")]))
        assert count.non_embedding - count.repo == stock.non_embedding
    tied = hf_parameter_count(LlamaConfig(**BASE, tie_word_embeddings=True))
    untied = hf_parameter_count(LlamaConfig(**BASE))
    assert untied.total - tied.total == VOCAB * 64 == untied.non_embedding - tied.non_embedding
    assert flops_main([str(dirs["repo_qwen3"]), "--tokens", "1e9"]) == 0
    n = hf_parameter_count(read_config(dirs["repo_qwen3"])).non_embedding
    assert f"| {dirs['repo_qwen3']} | {n:,} | 2,080 |" in capsys.readouterr().out
    assert flops_main([str(dirs["llama"].parent)]) == 1
    assert "no config.json" in one_error_line(capsys, "flops.py")


@pytest.mark.parametrize("tied", [False, True])
def test_flops_of_an_olmo_hf_directory_are_ai2_olmos(tmp_path, tokenizer_file, tied):
    """One count for both sides: the HF directory converted from an OLMo checkpoint counts what ai2-olmo counts of
    the model (grouped-query attention, RePo layers 1..3)."""
    from olmo_repo.ai2olmo.hf import convert_to_hf

    overrides = dict(pe_mode="repo", pe_start_layer=1, n_kv_heads=2, weight_tying=tied)
    ckpt, olmo = make_checkpoint(tmp_path / "ckpt", tokenizer_file, **overrides)
    hf_dir = convert_to_hf(ckpt, tmp_path / "hf")
    assert isinstance(read_config(hf_dir), Olmo2Config)
    from olmo_repo import RepoTrainConfig

    ours = parameter_count(RepoTrainConfig.load(ckpt / "config.yaml", validate_paths=False).model)
    assert hf_parameter_count(read_config(hf_dir)) == ours
    assert ours.non_embedding == olmo.num_params(include_embedding=False) and ours.repo > 0


def test_vllm_on_cpu_reserves_the_kv_cache_its_batch_needs():
    """`load_vllm` on CPU sets VLLM_CPU_KVCACHE_SPACE where the user has not (vLLM's default asks for 92% of the
    machine and refuses to start when less is free): keys and values of every layer and key/value head."""
    from transformers import LlamaConfig

    from olmo_repo.eval.vllm_backend import kv_cache_gib

    smollm2 = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    # 2 x 30 layers x 3 heads x 64 x 4 bytes = 46,080 bytes a token; x 4096 x 8 = 1.41 GiB -> 2, + 1 headroom
    assert kv_cache_gib(smollm2, 4096, 8, "float32") == 3
    assert kv_cache_gib(smollm2, 4096, 8, "bfloat16") == 2  # 0.70 GiB -> 1, + 1
    assert kv_cache_gib(smollm2, 8192, 8, "float32") == 4  # 2.81 GiB -> 3, + 1
