"""Training cost of a model, with the paper's convention.

Training FLOPs = 6 * N * D: D training tokens, N the parameters without the input embedding (OLMo's
`num_params(include_embedding=False)`: the untied output projection counts, the embedding lookup does not),
2 FLOPs per multiply-accumulate times 3 for forward + backward; attention's T^2 term is left out. This is the
count that reproduces the paper's figures for OLMo-2 1B at 50B tokens to three digits: 3.84e20 for RoPE
(N = 1,279,395,840) and 3.87e20 for RePo (N + 11,579,392 f_phi weights, the "+0.9%"). Counting the
embedding too would give 4.45e20 / 4.49e20.

Parameters are counted on a model built on the meta device (`olmo_repo.hf.params`: no memory, any size), from
an ai2-olmo model config (`parameter_count`, `training_flops`) or from a transformers config of any family, stock
or RePo (`hf_parameter_count`: OLMo 2/3, Llama, Qwen 3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .errors import RepoError
from .hf.params import ParameterCount, count_parameters, hf_parameter_count
from .tables import markdown_table

if TYPE_CHECKING:  # ai2-olmo loads only where a count of theirs is asked for
    from olmo.config import ModelConfig

__all__ = [
    "ParameterCount",
    "flops_table",
    "hf_parameter_count",
    "parameter_count",
    "training_flops",
    "training_model_config",
]


def parameter_count(model_config: ModelConfig) -> ParameterCount:
    """Count the parameters of an ai2-olmo `model_config` (built on the meta device; the config is not
    modified)."""
    from .ai2olmo.registry import build_model

    model = build_model(dataclasses.replace(model_config, init_device="meta"))
    return count_parameters(model, model.transformer.wte.weight)


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

    from .ai2olmo.config import RepoTrainConfig

    try:
        return RepoTrainConfig.load(path, validate_paths=False).model
    except (FileNotFoundError, OLMoConfigurationError, ValueError) as e:
        raise RepoError(f"{path}: {e}") from None


def _sci(x: float) -> str:
    return f"{x:.3g}".replace("e+", "e")
