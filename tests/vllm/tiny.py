"""Tiny HF checkpoints for the vLLM tests, built with `olmo_repo.hf` only (no OLMo, no downloads).

Weights are drawn so that the models are far from uniform (clear greedy choices) and f_phi predicts
positions spread over hundreds (`spread`), so that a rotation error would show.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from olmo_repo.hf import (
    RepoLlamaConfig,
    RepoLlamaForCausalLM,
    RepoOlmo2Config,
    RepoOlmo2ForCausalLM,
    RepoOlmo3Config,
    RepoOlmo3ForCausalLM,
    RepoQwen3Config,
    RepoQwen3ForCausalLM,
)
from olmo_repo.hf.files import AUTO_MAP, REMOTE_CODE, save_hf
from olmo_repo.hf.formats import from_reference
from olmo_repo.modes import F_PHI_WEIGHTS, layer_modes
from olmo_repo.rope import repo_layers

VOCAB, EOS, PAD = 384, 256, 257
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=128,  # 4 heads of 32: the smallest head size vLLM's CPU attention takes
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
    eos_token_id=EOS,
    pad_token_id=PAD,
    tie_word_embeddings=False,
)


def tokenizer() -> PreTrainedTokenizerFast:
    """Lossless byte-level tokenizer: 256 byte tokens, <eos> (256), <pad> (257)."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<eos>": EOS, "<pad>": PAD})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>", "<pad>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def _randomise(model: torch.nn.Module, spread: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if p.dim() == 1:  # norms
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("final_map.weight"):
                p.copy_(spread * torch.randn(p.shape, generator=gen))
            elif name.endswith(("gate_map.weight", "content_map.weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def save(
    path: Path,
    *,
    remote_code: bool = False,
    olmo3: bool = False,
    spread: float = 0.25,
    seed: int = 0,
    **overrides: Any,
) -> torch.nn.Module:
    """A `repo_olmo2` checkpoint (plain `olmo2` when every layer is RoPE; `repo_olmo3` with `olmo3`) in `path`;
    returns the HF model."""
    if olmo3:
        config = RepoOlmo3Config(**{**BASE, **overrides})
        model = RepoOlmo3ForCausalLM(config)
    else:
        config = RepoOlmo2Config(**{**BASE, **overrides})
        stock = all(m == "rope" for m in layer_modes(config))
        model = (
            Olmo2ForCausalLM(Olmo2Config(**{**BASE, **overrides})) if stock else RepoOlmo2ForCausalLM(config)
        )
    _randomise(model, spread, seed)
    model.eval().save_pretrained(path)
    tokenizer().save_pretrained(path)
    if remote_code:
        for name, source in REMOTE_CODE[config.model_type].items():
            shutil.copy(source, path / name)
        raw = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(
            json.dumps({**raw, "auto_map": AUTO_MAP[config.model_type]}, indent=2)
        )
    return model


def save_family(
    path: Path, family: str, *, spread: float = 0.25, seed: int = 0, stock: bool = False, **overrides: Any
) -> torch.nn.Module:
    """A `repo_llama` or `repo_qwen3` checkpoint (`family`: "llama", "qwen3"; with `stock`, transformers' own
    `llama` or `qwen3`) in `path`, written as the converters write one (`save_hf`: the weights checked against the
    config, the remote code); returns the HF model."""
    config_class, model_class = {
        "llama": (RepoLlamaConfig, RepoLlamaForCausalLM),
        "qwen3": (RepoQwen3Config, RepoQwen3ForCausalLM),
        "stock llama": (LlamaConfig, LlamaForCausalLM),
        "stock qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }[f"stock {family}" if stock else family]
    config = config_class(**{**BASE, **overrides})
    model = model_class(config)
    _randomise(model, spread, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):  # attention biases (Llama's `attention_bias`): small, unlike the norms
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        if config.tie_word_embeddings:  # at unit scale, tied logits reach ~50 (and the fp32 bound with them)
            model.get_input_embeddings().weight.mul_(0.3)
    state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        del state_dict["lm_head.weight"]  # the converters write a tied model's embedding once
    path.mkdir(parents=True)
    save_hf(config_class.from_dict(config.to_dict()), state_dict, path, None)
    tokenizer().save_pretrained(path)
    return model.eval()


def save_reference(
    path: Path, pe_config: dict[str, Any], *, seed: int = 0, **overrides: Any
) -> torch.nn.Module:
    """The reference implementation's format: an `olmo2` config.json with `pe_config`, RePo weights under
    `self_attn`; the HF model is this project's, built from the translated config."""
    config = RepoOlmo2Config.from_dict(
        from_reference({**BASE, **overrides, "pe_config": pe_config}, None, "test")
    )
    model = RepoOlmo2ForCausalLM(config)
    _randomise(model, 0.25, seed)
    path.mkdir(parents=True)
    raw = Olmo2Config(**{**BASE, **overrides}).to_dict()
    raw.update(architectures=["Olmo2ForCausalLM"], pe_config=pe_config)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path / "model.safetensors")
    tokenizer().save_pretrained(path)
    return model.eval()


def start_recording_positions(model: torch.nn.Module) -> None:
    """Run in the engine (`LLM.apply_model`): from now on keep (layer id, positions [H_kv, T]) of every RePo layer's
    forward, through the layer's observation point (`positions_out`)."""
    recorded: list[tuple[int, torch.Tensor]] = []
    model.recorded_positions = recorded
    model.position_hooks = [
        layer.positions_out.register_forward_hook(
            lambda _m, _args, out, i=layer.layer_id: recorded.append((i, out.detach().float().cpu()))
        )
        for layer in repo_layers(model)
    ]


def stop_recording_positions(model: torch.nn.Module) -> list[tuple[int, torch.Tensor]]:
    """Run in the engine: remove the hooks; what they kept, in call order."""
    for hook in model.position_hooks:
        hook.remove()
    return model.recorded_positions


def save_repo_of(
    path: Path, stock: torch.nn.Module, *, spread: float = 0.25, seed: int = 1, **keys: Any
) -> torch.nn.Module:
    """`stock`'s weights (a model of `save`) in a `repo_olmo2` checkpoint with the position keys `keys` and an f_phi
    drawn as `save` draws it (positions in the hundreds, as a trained one's may be), in `path`; returns the HF
    model."""
    config = RepoOlmo2Config(**{**BASE, **keys})
    model = RepoOlmo2ForCausalLM(config)
    missing, unexpected = model.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and missing and all(name.split(".")[-2] in F_PHI_WEIGHTS for name in missing)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in missing:
            scale = spread if name.endswith("final_map.weight") else 0.5
            model.get_parameter(name).copy_(
                scale * torch.randn(model.get_parameter(name).shape, generator=gen)
            )
    model.eval().save_pretrained(path)
    tokenizer().save_pretrained(path)
    return model
