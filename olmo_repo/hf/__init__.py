"""Hugging Face side of RePo. Importing this module registers `repo_olmo2` with transformers' Auto classes,
so `AutoModelForCausalLM.from_pretrained(dir)` loads a converted RePo checkpoint without remote code.

It also routes the reference implementation's format (`model_type: olmo2` with a nested `pe_config`): stock
transformers would build a stock Olmo2 from it and drop the RePo weights. After this import,
`AutoModelForCausalLM`/`AutoModel` build `RepoOlmo2ForCausalLM`/`RepoOlmo2Model` for such a config (read by
`RepoOlmo2Config.dict_from_reference`) and the stock classes, unchanged, for every other `olmo2` config.
"""

from typing import Any

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Olmo2Config, PreTrainedModel
from transformers.models.olmo2.modeling_olmo2 import Olmo2ForCausalLM, Olmo2Model

from .configuration_repo_olmo2 import RepoOlmo2Config, hub_kwargs, weight_names
from .modeling_repo_olmo2 import (
    RepoOlmo2CausalLMOutputWithPast,
    RepoOlmo2ForCausalLM,
    RepoOlmo2Model,
    RepoOlmo2ModelOutputWithPast,
    record_positions,
)


def _olmo2_or_reference(stock: type[PreTrainedModel], repo: type[PreTrainedModel]) -> type[PreTrainedModel]:
    """What an Auto class builds for an `olmo2` config: `stock`, or `repo` if the config has `pe_config`."""

    def repo_config(config: Olmo2Config, weights: list[str] | None, source: str) -> RepoOlmo2Config:
        return RepoOlmo2Config.from_dict(
            RepoOlmo2Config.dict_from_reference(config.to_dict(), weights, source)
        )

    class Olmo2OrReference(stock):  # type: ignore[misc,valid-type]
        @classmethod
        def from_pretrained(
            cls, path: Any, *args: Any, config: Olmo2Config, **kwargs: Any
        ) -> PreTrainedModel:
            if getattr(config, "pe_config", None) is None:
                return stock.from_pretrained(path, *args, config=config, **kwargs)
            config = repo_config(config, weight_names(path, **hub_kwargs(kwargs)), str(path))
            return repo.from_pretrained(path, *args, config=config, **kwargs)

        @classmethod
        def _from_config(cls, config: Olmo2Config, **kwargs: Any) -> PreTrainedModel:
            if getattr(config, "pe_config", None) is None:
                return stock._from_config(config, **kwargs)
            return repo._from_config(repo_config(config, None, "config"), **kwargs)

    Olmo2OrReference.__name__ = Olmo2OrReference.__qualname__ = f"{stock.__name__}OrReference"
    return Olmo2OrReference


AutoConfig.register(RepoOlmo2Config.model_type, RepoOlmo2Config, exist_ok=True)
AutoModel.register(RepoOlmo2Config, RepoOlmo2Model, exist_ok=True)
AutoModelForCausalLM.register(RepoOlmo2Config, RepoOlmo2ForCausalLM, exist_ok=True)
AutoModel.register(Olmo2Config, _olmo2_or_reference(Olmo2Model, RepoOlmo2Model), exist_ok=True)
AutoModelForCausalLM.register(
    Olmo2Config, _olmo2_or_reference(Olmo2ForCausalLM, RepoOlmo2ForCausalLM), exist_ok=True
)

__all__ = [
    "RepoOlmo2CausalLMOutputWithPast",
    "RepoOlmo2Config",
    "RepoOlmo2ForCausalLM",
    "RepoOlmo2Model",
    "RepoOlmo2ModelOutputWithPast",
    "record_positions",
]
