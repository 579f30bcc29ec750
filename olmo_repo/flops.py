"""Training cost of a model config, with the paper's convention.

Training FLOPs = 6 * N * D: D training tokens, N the parameters without the input embedding (OLMo's
`num_params(include_embedding=False)`: the untied output projection counts, the embedding lookup does not),
2 FLOPs per multiply-accumulate times 3 for forward + backward; attention's T^2 term is left out. This is the
count that reproduces the paper's figures for OLMo-2 1B at 50B tokens to three digits: 3.84e20 for RoPE
(N = 1,279,395,840) and 3.87e20 for RePo (N + 11,579,392 f_phi weights, the "+0.9%"). Counting the
embedding too would give 4.45e20 / 4.49e20.

Parameters are counted on a model built on the meta device: no memory, any size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from olmo.config import ModelConfig

from .errors import RepoError
from .modes import F_PHI_WEIGHTS
from .registry import build_model
from .tables import markdown_table

__all__ = ["ParameterCount", "flops_table", "parameter_count", "training_flops"]


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


def parameter_count(model_config: ModelConfig) -> ParameterCount:
    """Count the parameters of `model_config` (built on the meta device; the config is not modified)."""
    model = build_model(dataclasses.replace(model_config, init_device="meta"))
    repo = sum(p.numel() for name, p in model.named_parameters() if name.split(".")[-2] in F_PHI_WEIGHTS)
    return ParameterCount(model.num_params(), model.num_params(include_embedding=False), repo)


def training_flops(model_config: ModelConfig, tokens: float) -> float:
    """Training FLOPs of `model_config` on `tokens` tokens: 6 * (non-embedding parameters) * tokens."""
    return parameter_count(model_config).training_flops(tokens)


def flops_table(config_paths: Sequence[str], tokens: float) -> str:
    """A Markdown table of the training configs at `config_paths`: N, f_phi's parameters and share, and the
    training FLOPs at `tokens` tokens without and with f_phi. `RepoError` naming a file that cannot be read."""
    rows = []
    for path in config_paths:
        count = parameter_count(_model_config(path))
        rows.append(
            [
                path,
                f"{count.non_embedding:,}",
                f"{count.repo:,}",
                f"{100 * count.repo_overhead:.3g}%",
                _sci(count.training_flops(tokens, with_repo=False)),
                _sci(count.training_flops(tokens)),
            ]
        )
    header = ["config", "N", "f_phi", "f_phi / rest", "FLOPs without f_phi", "FLOPs"]
    return (
        f"Training FLOPs at {_sci(tokens)} tokens (6 N D, N = non-embedding parameters)\n\n"
        + markdown_table(header, rows)
    )


def _model_config(path: str) -> ModelConfig:
    """The model of the training config `path`; RepoError naming the file when it cannot be read."""
    from olmo.exceptions import OLMoConfigurationError

    from .config import RepoTrainConfig

    try:
        return RepoTrainConfig.load(path, validate_paths=False).model
    except (FileNotFoundError, OLMoConfigurationError, ValueError) as e:
        raise RepoError(f"{path}: {e}") from None


def _sci(x: float) -> str:
    return f"{x:.3g}".replace("e+", "e")
