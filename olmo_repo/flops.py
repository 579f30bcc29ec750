"""Training cost of a model, with the paper's convention.

Training FLOPs = 6 * N * D: D training tokens, N the parameters without the input embedding (OLMo's
`num_params(include_embedding=False)`: the untied output projection counts, the embedding lookup does not),
2 FLOPs per multiply-accumulate times 3 for forward + backward; attention's T^2 term is left out. This is the
count that reproduces the paper's figures for OLMo-2 1B at 50B tokens to three digits: 3.84e20 for RoPE
(N = 1,279,395,840) and 3.87e20 for RePo (N + 11,579,392 f_phi weights, the "+0.9%"). Counting the
embedding too would give 4.45e20 / 4.49e20.

Parameters are counted on a model built on the meta device: no memory, any size. One count for every model
(`_count`: each parameter once, so a tied output projection is the embedding, less the input embedding's
weight), built from an ai2-olmo model config (`parameter_count`) or from a transformers config of any family,
stock or RePo (`hf_parameter_count`: OLMo 2/3, Llama, Qwen 3, as `olmo_repo.hf.read_hf_config` reads an HF
directory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .errors import RepoError
from .modes import F_PHI_WEIGHTS
from .tables import markdown_table

if TYPE_CHECKING:  # ai2-olmo and transformers load only where a count of theirs is asked for
    from olmo.config import ModelConfig
    from transformers import PretrainedConfig

__all__ = [
    "ParameterCount",
    "flops_table",
    "hf_parameter_count",
    "parameter_count",
    "training_flops",
    "training_model_config",
]


@dataclass(frozen=True)
class ParameterCount:
    total: int
    """Every parameter, embedding included."""
    non_embedding: int
    """Without the input embedding: the N of 6 N D."""
    repo: int
    """The f_phi weights (gate_map, content_map, final_map) of the RePo layers; part of `non_embedding`. With
    grouped-query attention final_map has one row per key/value head."""

    @property
    def repo_overhead(self) -> float:
        """f_phi weights relative to the model without them (non-embedding): 0.00905 for the 1B."""
        return self.repo / (self.non_embedding - self.repo)

    def training_flops(self, tokens: float, *, with_repo: bool = True) -> float:
        """6 N D; `with_repo=False` leaves the f_phi weights out of N (the same model with RoPE layers)."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0; got {tokens}")
        return 6.0 * (self.non_embedding if with_repo else self.non_embedding - self.repo) * tokens


def _count(model: nn.Module, embedding: nn.Parameter) -> ParameterCount:
    """The count of a built `model` whose input embedding is `embedding` (see the module docstring)."""
    params = dict(model.named_parameters())  # each tensor once: a tied output projection is the embedding
    total = sum(p.numel() for p in params.values())
    repo = sum(p.numel() for name, p in params.items() if name.split(".")[-2] in F_PHI_WEIGHTS)
    return ParameterCount(total, total - embedding.numel(), repo)


def parameter_count(model_config: ModelConfig) -> ParameterCount:
    """Count the parameters of an ai2-olmo `model_config` (built on the meta device; the config is not
    modified)."""
    from .registry import build_model

    model = build_model(dataclasses.replace(model_config, init_device="meta"))
    return _count(model, model.transformer.wte.weight)


def hf_parameter_count(config: PretrainedConfig) -> ParameterCount:
    """Count the parameters of the causal LM that transformers' Auto class builds for `config` (any family this
    project reads; the RePo ones are registered by `olmo_repo.hf`, whose modules their configs are), built on
    the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return _count(model, model.get_input_embeddings().weight)


def training_flops(model_config: ModelConfig, tokens: float) -> float:
    """Training FLOPs of `model_config` on `tokens` tokens: 6 * (non-embedding parameters) * tokens."""
    return parameter_count(model_config).training_flops(tokens)


def flops_table(counts: Mapping[str, ParameterCount], tokens: float) -> str:
    """A Markdown table of {name: count} (training configs, HF directories): N, f_phi's parameters and share,
    and the training FLOPs at `tokens` tokens without and with f_phi."""
    rows = []
    for name, count in counts.items():
        rows.append(
            [
                name,
                f"{count.non_embedding:,}",
                f"{count.repo:,}",
                f"{100 * count.repo_overhead:.3g}%",
                _sci(count.training_flops(tokens, with_repo=False)),
                _sci(count.training_flops(tokens)),
            ]
        )
    header = ["model", "N", "f_phi", "f_phi / rest", "FLOPs without f_phi", "FLOPs"]
    return (
        f"Training FLOPs at {_sci(tokens)} tokens (6 N D, N = non-embedding parameters)\n\n"
        + markdown_table(header, rows)
    )


def training_model_config(path: str) -> ModelConfig:
    """The model of the ai2-olmo training config `path`; RepoError naming the file when it cannot be read."""
    from olmo.exceptions import OLMoConfigurationError

    from .config import RepoTrainConfig

    try:
        return RepoTrainConfig.load(path, validate_paths=False).model
    except (FileNotFoundError, OLMoConfigurationError, ValueError) as e:
        raise RepoError(f"{path}: {e}") from None


def _sci(x: float) -> str:
    return f"{x:.3g}".replace("e+", "e")
