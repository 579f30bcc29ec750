"""transformers 5.24.0: routing the reference format through the `olmo2` Auto classes; private names read.

What transformers lacks, and what this module does about it:

- An Auto class maps a config class to one model class. The reference implementation's checkpoints say
  `model_type: olmo2` (stock) with a nested `pe_config`, so stock transformers builds a stock Olmo2 from them
  and drops the RePo weights. `olmo2_or_reference(stock, repo)` is the class registered for `Olmo2Config`
  instead: it builds `stock` for every `olmo2` config without `pe_config`, and `repo` for the others, from
  `from_pretrained` and from the private `_from_config` (what `AutoModel*.from_config` calls).
- `attn_implementation(model)`: the private `config._attn_implementation` (the implementation in use).

The HF modeling and configuration files travel into converted checkpoints as remote code and cannot import
this package: what they take from transformers' internals is marked in place ("restated from transformers
5.24.0" for the attention forward of `Olmo2Attention`, `Olmo3Attention` and `Qwen3Attention` (with a sliding
window) and `LlamaAttention`, which differ only in the q/k/v projection; the attention attributes
their `__init__` sets, `attention_type` and `sliding_window` included; Olmo2's `eager_attention_forward`,
the eager fallback of every family's RePo attention, which must stay the same as the other families'; the
private `_raise_exceptions_for_missing_entries` of `cached_file`, `config._attn_implementation`) and listed in
`CANARIES` with the rest. So is what the RoPE check of the HF configs (`ROPE_TYPES`) relies on: that Llama
3's inverse frequencies do not depend on the sequence length (the private `_compute_llama3_parameters`) and
that `dynamic_rope_update` recomputes only `dynamic` and `longrope` frequencies.
"""

from __future__ import annotations

from typing import Any

from transformers import Olmo2Config, PreTrainedModel

__all__ = ["CANARIES", "attn_implementation", "olmo2_or_reference"]

VERSION = "5.24.0"
CANARIES = {
    "transformers.models.olmo2.modeling_olmo2.Olmo2Attention.forward": "4c62a7cb133a0250",
    "transformers.models.olmo2.modeling_olmo2.Olmo2Attention.__init__": "202f2027df76d67e",
    "transformers.models.olmo3.modeling_olmo3.Olmo3Attention.forward": "e6ca44ec57eff411",
    "transformers.models.olmo3.modeling_olmo3.Olmo3Attention.__init__": "35730b443753d42e",
    "transformers.models.llama.modeling_llama.LlamaAttention.forward": "e080b5cc468cd0a5",
    "transformers.models.llama.modeling_llama.LlamaAttention.__init__": "0908be3a26b1820c",
    "transformers.models.qwen3.modeling_qwen3.Qwen3Attention.forward": "648a188563d3f5ea",
    "transformers.models.qwen3.modeling_qwen3.Qwen3Attention.__init__": "6419143ef4436bb2",
    # The same source: the RePo attention of every family falls back to Olmo2's eager attention.
    "transformers.models.olmo2.modeling_olmo2.eager_attention_forward": "cb34ccea28710ae8",
    "transformers.models.olmo3.modeling_olmo3.eager_attention_forward": "cb34ccea28710ae8",
    "transformers.models.llama.modeling_llama.eager_attention_forward": "cb34ccea28710ae8",
    "transformers.models.qwen3.modeling_qwen3.eager_attention_forward": "cb34ccea28710ae8",
    "transformers.modeling_rope_utils._compute_llama3_parameters": "7f67116f2b3279cf",
    "transformers.modeling_rope_utils.dynamic_rope_update": "c0bc145a218270ce",
    "transformers.modeling_utils.PreTrainedModel._from_config": "98702b52003e3ba7",
    "transformers.utils.hub.cached_file": "e50849aace67b3c2",
}


def olmo2_or_reference(
    stock: type[PreTrainedModel], repo: type[PreTrainedModel], translate: Any, weight_shapes: Any
) -> type[PreTrainedModel]:
    """What an Auto class builds for an `olmo2` config: `stock`, or `repo` if the config has `pe_config`.

    translate(config, shapes, source) -> the `repo` config of a reference-format config; weight_shapes(path,
    **hub kwargs) -> the checkpoint's weights and shapes (which layers carry RePo weights), or None.
    """

    class Olmo2OrReference(stock):  # type: ignore[misc,valid-type]
        @classmethod
        def from_pretrained(
            cls, path: Any, *args: Any, config: Olmo2Config, **kwargs: Any
        ) -> PreTrainedModel:
            if getattr(config, "pe_config", None) is None:
                return stock.from_pretrained(path, *args, config=config, **kwargs)
            config = translate(config, weight_shapes(path, **kwargs), str(path))
            return repo.from_pretrained(path, *args, config=config, **kwargs)

        @classmethod
        def _from_config(cls, config: Olmo2Config, **kwargs: Any) -> PreTrainedModel:
            if getattr(config, "pe_config", None) is None:
                return stock._from_config(config, **kwargs)
            return repo._from_config(translate(config, None, "config"), **kwargs)

    Olmo2OrReference.__name__ = Olmo2OrReference.__qualname__ = f"{stock.__name__}OrReference"
    return Olmo2OrReference


def attn_implementation(model: PreTrainedModel) -> str:
    """The attention implementation `model` runs with (eager, sdpa, ...)."""
    return model.config._attn_implementation
