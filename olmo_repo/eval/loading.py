"""Loading a model for evaluation at a target length, with YaRN past its training length.

The paper evaluates every method at 8K and 16K with YaRN (factor 2 and 4 over the 4096 training length) on
the RoPE layers and on the RePo positions. Here that is the HF config's `rope_parameters`
(`rope_type: yarn`, `factor`, `original_max_position_embeddings`), which stock Olmo2 and this project's
`repo_olmo2` both read (RePo and RoPE layers share the scaled inverse frequencies and attention factor).
OLMo 3 (`olmo3`, `repo_olmo3`) has a RoPE per layer type; as OLMo 3's own long-context models do, YaRN
scales the full-attention layers' only: a sliding-window layer sees no farther at 16K than in training.

- `training_length(config)`: `rope_parameters.original_max_position_embeddings` if set, else
  `max_position_embeddings`.
- `yarn_factor(length, training, yarn)`: `yarn="auto"`: length / training past the training length, none within
  it; `"off"`: none; a number: that factor past the training length.
- `load_model(hf_dir, length, yarn, dtype, device)`: the model in eval mode, with YaRN where the factor says.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from olmo_repo.hf import DTYPES, read_hf_config  # (importing olmo_repo.hf registers repo_olmo2 with Auto*)

from .variants import parse_yarn  # light: the command checks --yarn before importing this module

__all__ = ["DTYPES", "load_model", "parse_yarn", "training_length", "yarn_factor", "yarn_overrides"]


def _full_attention_rope(config: PretrainedConfig) -> dict:
    """The RoPE parameters of the full-attention layers (OLMo 3: `rope_parameters.full_attention`)."""
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("full_attention") or {} if getattr(config, "layer_types", None) else rope


def training_length(config: PretrainedConfig) -> int:
    """The context length the model was trained at."""
    rope = _full_attention_rope(config)
    return int(rope.get("original_max_position_embeddings") or config.max_position_embeddings)


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
) -> PreTrainedModel:
    """The causal LM in `hf_dir` for a `length`-token context (YaRN per `yarn_factor`), in eval mode. Its
    config is read and checked as every reader of an HF directory does (`read_hf_config`: a misspelt position
    key, f_phi weights that do not fit): ValueError naming the file."""
    overrides = yarn_overrides(read_hf_config(hf_dir), length, yarn)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=DTYPES[dtype], **overrides)
    return model.to(device).eval()


def yarn_overrides(config: PretrainedConfig, length: int, yarn: str | float = "auto") -> dict:
    """The config keys to override for a `length`-token context (empty: none); shared with `--backend vllm`."""
    training = training_length(config)
    factor = yarn_factor(length, training, yarn)
    if factor is None:
        return {}
    theta = _full_attention_rope(config).get("rope_theta", 10_000.0)
    rope = {
        "rope_type": "yarn",
        "rope_theta": float(theta),
        "factor": factor,
        "original_max_position_embeddings": training,
    }
    if getattr(config, "layer_types", None):  # OLMo 3: the sliding-window layers keep theirs
        rope = {
            "sliding_attention": dict(config.rope_parameters["sliding_attention"]),
            "full_attention": rope,
        }
    return dict(rope_parameters=rope, max_position_embeddings=max(length, config.max_position_embeddings))
