"""Parameters of a model built on the meta device (no memory, any size): the N of the training cost 6 N D
(`olmo_repo.flops`).

One count for every model (`count_parameters`: each parameter once, so a tied output projection is the
embedding, less the input embedding's weight): of any built torch model, or of the causal LM that transformers
builds from a config of any family this project reads, stock or RePo (`hf_parameter_count`: OLMo 2/3, Llama,
Qwen 3, as `olmo_repo.hf.read_hf_config` reads an HF directory). Evaluation's report counts with it; the
ai2-olmo training configs are counted by `olmo_repo.flops`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..modes import F_PHI_WEIGHTS

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["ParameterCount", "count_parameters", "hf_parameter_count"]


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


def count_parameters(model: nn.Module, embedding: nn.Parameter) -> ParameterCount:
    """The count of a built `model` whose input embedding is `embedding` (see the module docstring)."""
    params = dict(model.named_parameters())  # each tensor once: a tied output projection is the embedding
    total = sum(p.numel() for p in params.values())
    repo = sum(p.numel() for name, p in params.items() if name.split(".")[-2] in F_PHI_WEIGHTS)
    return ParameterCount(total, total - embedding.numel(), repo)


def hf_parameter_count(config: PretrainedConfig) -> ParameterCount:
    """Count the parameters of the causal LM that transformers' Auto class builds for `config` (any family this
    project reads; the RePo ones are registered by `olmo_repo.hf`, whose modules their configs are), built on
    the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return count_parameters(model, model.get_input_embeddings().weight)
