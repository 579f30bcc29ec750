"""Loading a model for evaluation at a target length, with YaRN past its training length.

The paper evaluates every method at 8K and 16K with YaRN (factor 2 and 4 over the 4096 training length) on
the RoPE layers and on the RePo positions. Here that is the HF config's `rope_parameters`
(`rope_type: yarn`, `factor`, `original_max_position_embeddings`), which every family read here takes, stock
and RePo (`olmo2`, `olmo3`, `llama`, `qwen3` and their `repo_*`: RePo and RoPE layers share the scaled inverse
frequencies and attention factor). OLMo 3 (`olmo3`, `repo_olmo3`) has a RoPE per layer type; as OLMo 3's own
long-context models do, YaRN scales the full-attention layers' only: a sliding-window layer sees no farther at
16K than in training.

- `read_config(hf_dir)`: the config of any family evaluation takes (`ALL_MODEL_TYPES`), read and checked as
  every reader of an HF directory does; the one reader of the evaluation, the analyses and the explorer.
- `training_length(config)`: a YaRN model's `original_max_position_embeddings`, else `max_position_embeddings`
  (a model scaled otherwise, e.g. Llama 3's `rope_type: llama3`, is meant for its `max_position_embeddings`).
- `yarn_factor(length, training, yarn)`: `yarn="auto"`: length / training past the training length, none within
  it; `"off"`: none; a number: that factor past the training length.
- `yarn_overrides(config, length, yarn)`: the config keys that set it. YaRN replaces an unscaled RoPE
  (`default`) or rescales a YaRN one from its original length; it is not stacked on another scaling (`llama3`,
  `linear`, ...): past such a model's length that is one ValueError, and `yarn="off"` evaluates it there with
  its own scaling.
- `position_overrides(config, positions)`: the config key (`pe_positions`) that replaces the positions of RePo
  layers at evaluation (`--positions`: the token index, RoPE; one constant position, NoPE), checked as the
  config checks it (`modes.check_scored_positions`: refused for a model without RePo layers). The one place the
  evaluation, the analyses and the explorer set it, on HF (`from_pretrained`) and vLLM (`hf_overrides`) alike.
- `load_model(hf_dir, length, yarn, dtype, device, positions)`: the model in eval mode, with YaRN where the
  factor says and its RePo layers' positions as `positions` says.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

# (importing olmo_repo.hf registers the repo_* families with the Auto classes)
from olmo_repo.hf import DTYPES, read_hf_config
from olmo_repo.hf.formats import ALL_MODEL_TYPES

from ..modes import PositionSource, ScoredPositionKeys, check_scored_positions, repo_layer_ids
from .variants import parse_yarn  # light: the command checks --yarn before importing this module

__all__ = [
    "DTYPES",
    "YARN_REPLACES",
    "load_model",
    "parse_yarn",
    "position_overrides",
    "read_config",
    "training_length",
    "yarn_factor",
    "yarn_overrides",
]

YARN_REPLACES = ("default", "yarn")
"""The RoPE types that YaRN past the training length replaces: unscaled, or YaRN from its original length."""


def read_config(hf_dir: str | Path) -> PretrainedConfig:
    """The config of an HF directory of any family evaluation takes: OLMo 2/3, Llama, Qwen 3, stock or RePo
    (`read_hf_config` with `ALL_MODEL_TYPES`: the reference's format too, f_phi checked; ValueError naming the
    file otherwise)."""
    return read_hf_config(hf_dir, ALL_MODEL_TYPES)


def _per_layer_type(config: PretrainedConfig) -> bool:
    """Whether the config has a RoPE per layer type (OLMo 3's `rope_parameters`: {layer type: parameters});
    Qwen 3 has layer types too (its sliding windows), but one RoPE for all of them."""
    return "full_attention" in (getattr(config, "rope_parameters", None) or {})


def _full_attention_rope(config: PretrainedConfig) -> dict:
    """The RoPE parameters of the full-attention layers (OLMo 3: `rope_parameters.full_attention`)."""
    rope = getattr(config, "rope_parameters", None) or {}
    return rope["full_attention"] or {} if _per_layer_type(config) else rope


def training_length(config: PretrainedConfig) -> int:
    """The context length the model was trained at: a YaRN model's original length, else
    `max_position_embeddings` (Llama 3's `llama3` scaling was trained out to it; its
    `original_max_position_embeddings` is the length before that)."""
    rope = _full_attention_rope(config)
    if rope.get("rope_type", "default") == "yarn" and rope.get("original_max_position_embeddings"):
        return int(rope["original_max_position_embeddings"])
    return int(config.max_position_embeddings)


def yarn_factor(length: int, training: int, yarn: str | float = "auto") -> float | None:
    """The YaRN factor to evaluate at `length` (None: the model as trained)."""
    if yarn == "off" or length <= training:
        return None
    return length / training if yarn == "auto" else float(yarn)


def load_model(
    hf_dir: str | Path,
    length: int,
    yarn: str | float = "auto",
    dtype: str = "float32",
    device: str = "cpu",
    positions: str = PositionSource.learned,
) -> PreTrainedModel:
    """The causal LM in `hf_dir` for a `length`-token context (YaRN per `yarn_factor`), its RePo layers rotating
    by `positions` (`position_overrides`), in eval mode. Its config is read and checked as every reader of an HF
    directory does (`read_config`: a family not taken, a misspelt position key, f_phi weights that do not fit):
    ValueError naming the file."""
    config, source = read_config(hf_dir), f"{hf_dir}/config.json"
    overrides = yarn_overrides(config, length, yarn, source) | position_overrides(config, positions, source)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=DTYPES[dtype], **overrides)
    return model.to(device).eval()


def position_overrides(
    config: PretrainedConfig, positions: str = PositionSource.learned, source: str = "config.json"
) -> dict:
    """The config key that makes the RePo layers of `config`'s model rotate by `positions`
    (`modes.PositionSource`): learned (f_phi's, the model as trained), index (the token index: each RePo layer
    scores as the RoPE layer it replaced) or constant (one position for every token: as NoPE), an ablation of what
    the learned positions contribute; empty for a model without RePo layers scored as it is. Anything else, or a
    replacement in a model without RePo layers, is one ValueError naming `source` (`modes.check_scored_positions`,
    the config's own check)."""
    has_repo = bool(repo_layer_ids(config))
    try:
        blend = getattr(config, "pe_blend", ScoredPositionKeys.pe_blend)
        check_scored_positions(blend, positions, has_repo=has_repo)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    return {"pe_positions": str(positions)} if has_repo else {}


def yarn_overrides(
    config: PretrainedConfig, length: int, yarn: str | float = "auto", source: str = "config.json"
) -> dict:
    """The config keys to override for a `length`-token context (empty: none); shared with `--backend vllm`.
    A RoPE scaled otherwise than by YaRN (`rope_type` not in `YARN_REPLACES`) past its length: ValueError
    naming `source`, as YaRN is not stacked on it."""
    training = training_length(config)
    factor = yarn_factor(length, training, yarn)
    if factor is None:
        return {}
    rope_type = _full_attention_rope(config).get("rope_type", "default")
    if rope_type not in YARN_REPLACES:
        raise ValueError(
            f"{source}: rope_type={rope_type!r} scales RoPE out to max_position_embeddings={training}; YaRN is "
            f"not stacked on it at {length} tokens: evaluate at <= {training}, or pass --yarn off to run past "
            "it with the model's own scaling"
        )
    theta = _full_attention_rope(config).get("rope_theta", 10_000.0)
    rope = {
        "rope_type": "yarn",
        "rope_theta": float(theta),
        "factor": factor,
        "original_max_position_embeddings": training,
    }
    if _per_layer_type(config):  # OLMo 3: the sliding-window layers keep theirs
        rope = {
            "sliding_attention": dict(config.rope_parameters["sliding_attention"]),
            "full_attention": rope,
        }
    return dict(rope_parameters=rope, max_position_embeddings=max(length, config.max_position_embeddings))
