"""OLMo-core checkpoints <-> Hugging Face directories: the Olmo 2 shape as `olmo2` (or `repo_olmo2` with RePo/NoPE
layers), the Olmo 3 shape (sliding windows) as `olmo3` (or `repo_olmo3`), OLMo-core's pre-norm block as `llama`
(or `repo_llama`) and, with per-head q/k norms, `qwen3` (or `repo_qwen3`).

- `core_to_hf(input, output)`: an OLMo-core checkpoint (a run's `stepN/` or a model-only one) -> an HF
  directory: config.json, safetensors, tokenizer, generation config and, for a model with RePo/NoPE layers,
  the modeling code as remote code (the same files and `auto_map` as `scripts/convert_to_hf.py` writes), so
  `scripts/eval.py`, the explorer, the analyses and vLLM take it as they take a converted ai2-olmo model.
- `hf_to_core(input, output)`: an HF `olmo2` / `repo_olmo2` / `olmo3` / `repo_olmo3` / reference-format /
  `llama` / `repo_llama` / `qwen3` / `repo_qwen3` directory -> a model-only OLMo-core checkpoint, the `load_path`
  of a run (stage-1 initialisation: a stock model's checkpoint has no f_phi weights, which a RePo config's init
  creates; a RePo model's carries them).

Both directions copy tensors as they are (dtype as stored unless `dtype` is given): a round trip is bit-exact.
Outputs are written beside the target and renamed at the end (`olmo_repo.output.staged_dir`).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from olmo_core.config import DType
from tokenizers import Tokenizer
from transformers import (
    PreTrainedConfig,
    PreTrainedTokenizerFast,
)

from ..errors import RepoError
from ..hf import DTYPES, read_hf_config
from ..hf.files import read_hf_state_dict, save_hf, save_tokenizer
from ..hf.formats import ALL_MODEL_TYPES
from ..modes import PE_KEYS, SCORED_PE_KEYS, ScoredPositionKeys
from ..output import check_distinct, check_replaceable, staged_dir
from . import checkpoint
from .attention import index_blend_at
from .convert import core_config_from_hf, hf_config_from_core, state_from_hf, state_to_hf

__all__ = ["core_to_hf", "hf_to_core"]

HF_EXTRA = "hf_config_extra"
"""The checkpoint config.json key of the HF config's keys that OLMo-core's model config has no place for: those
its class does not define (SmolLM2's `unk_token_id`, `is_llama_config`: no part of any model), and what its RePo
layers score with (`pe_blend`, `pe_positions`: a model-only checkpoint has no step of a run to take p from);
recorded by `hf_to_core` so that `core_to_hf` gives the config back whole."""

SCORED_ONLY = tuple(key for key in SCORED_PE_KEYS if key not in PE_KEYS)
"""The position keys an inference config scores with, which no training config holds (`pe_blend`,
`pe_positions`)."""


def _hf_extra(config: PreTrainedConfig) -> dict[str, Any]:
    """The keys of `config` (as save_pretrained writes them) that no field of its class holds, and those of
    `SCORED_ONLY` where not their default."""
    fields = {f.name for f in dataclasses.fields(type(config))} - set(SCORED_ONLY)
    meta = ("model_type", "transformers_version", "architectures", "auto_map")
    defaults = {f.name: f.default for f in dataclasses.fields(ScoredPositionKeys) if f.name in SCORED_ONLY}
    return {
        k: v
        for k, v in config.to_diff_dict().items()
        if k not in fields and k not in meta and (k not in defaults or v != defaults[k])
    }


def _tokenizer(identifier: str) -> Tokenizer:
    """A tokenizer.json file, a directory holding one, or a Hub id (offline: from the local cache only)."""
    path = Path(identifier)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    try:
        return PreTrainedTokenizerFast.from_pretrained(identifier).backend_tokenizer
    except (OSError, ValueError) as e:
        raise RepoError(
            f"tokenizer {identifier!r} is neither a tokenizer.json, a directory with one, nor a Hub id that can be "
            f"reached ({type(e).__name__}); pass --tokenizer"
        ) from None


def core_to_hf(
    input: str | Path,
    output: str | Path,
    *,
    force: bool = False,
    dtype: str | None = None,
    tokenizer: str | None = None,
    max_position_embeddings: int | None = None,
) -> Path:
    """Convert an OLMo-core checkpoint to an HF directory; returns `output`. Its `max_position_embeddings` is
    the training length the checkpoint records (`train_module.max_sequence_length`: a run's, or the HF model's
    that `hf_to_core` converted), or `max_position_embeddings` where it records none. Everything is checked
    (config shape, length, tokenizer) before the weights are read, and nothing is written on an error. RePo
    layers score with the index blend's p at the checkpoint's step (`pe_blend`: `modes.index_blend` of the
    model's schedule after `checkpoint.steps_done`), as training did there; the schedule is recorded beside it."""
    if dtype is not None and dtype not in DTYPES:
        raise RepoError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    check_distinct(input, output)
    check_replaceable(output, force)
    config = checkpoint.read_config(input)
    model_config = checkpoint.model_config(input)
    tok = (config.get("dataset") or {}).get("tokenizer") or {}
    length = max_position_embeddings or (config.get("train_module") or {}).get("max_sequence_length")
    if not length:  # no default: an HF config's max_position_embeddings is the length evaluation extends from
        raise RepoError(
            f"{input}/config.json records no training length (train_module.max_sequence_length); pass "
            "max_position_embeddings (--max-position-embeddings), the sequence length the model was trained at"
        )
    try:
        hf_config = hf_config_from_core(
            model_config,
            eos_token_id=tok.get("eos_token_id"),
            pad_token_id=tok.get("pad_token_id"),
            bos_token_id=tok.get("bos_token_id"),
            max_position_embeddings=int(length),
            pe_blend=index_blend_at(model_config, checkpoint.steps_done(input)),
        )
    except ValueError as e:
        raise RepoError(f"{input}/config.json: {e}") from None
    fields = {f.name for f in dataclasses.fields(type(hf_config))} - set(SCORED_ONLY)
    for key, value in (config.get(HF_EXTRA) or {}).items():
        if key not in fields:  # never over a value the model config gives
            setattr(hf_config, key, value)
    identifier = tokenizer or tok.get("identifier")
    if identifier is None:
        raise RepoError(f"{input}/config.json has no dataset.tokenizer.identifier; pass --tokenizer")
    base = _tokenizer(identifier)
    model = checkpoint.load_model(input, model_config)
    try:
        state = state_to_hf(hf_config, checkpoint.state_dict(model))
    except ValueError as e:
        raise RepoError(f"{input}: {e}") from None
    if dtype is not None:
        state = {k: v.to(DTYPES[dtype]) for k, v in state.items()}
    with staged_dir(output, force) as staging:
        save_hf(hf_config, state, staging, None)
        save_tokenizer(base, hf_config, staging)
    return Path(output)


def hf_to_core(input: str | Path, output: str | Path, *, force: bool = False) -> Path:
    """Convert an HF Olmo2-, Olmo3-, Llama- or Qwen3-shaped directory to a model-only OLMo-core checkpoint
    (`model_and_optim/`, a `config.json` with `model`, `dataset.tokenizer` and the HF model's length as
    `train_module.max_sequence_length`, the tokenizer.json copied beside); returns `output`. The weights are the
    HF model's, no more: a stock model's checkpoint is a stage-1 start, whose f_phi a RePo config creates."""
    input = Path(input)
    check_distinct(input, output)
    check_replaceable(output, force)
    hf_config = read_hf_config(input, ALL_MODEL_TYPES)
    try:
        core_config_from_hf(hf_config)  # every config key checked before the weights are read
    except ValueError as e:
        raise RepoError(f"{input}: {e}") from None
    state = read_hf_state_dict(input)
    dtype = next(iter(state.values())).dtype
    try:
        model_config = core_config_from_hf(hf_config, DType.from_pt(dtype))
        core_state = state_from_hf(hf_config, state)
    except ValueError as e:
        raise RepoError(f"{input}: {e}") from None
    model = model_config.build(init_device="meta")
    if model_config.tie_word_embeddings:
        core_state["lm_head.w_out.weight"] = core_state["embeddings.weight"]
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if {k: v.shape for k, v in core_state.items()} != expected:
        wrong = sorted(k for k in set(expected) | set(core_state) if k not in core_state or k not in expected)
        wrong += [
            f"{k} {tuple(core_state[k].shape)} (config.json: {tuple(expected[k])})"
            for k in sorted(set(expected) & set(core_state))
            if core_state[k].shape != expected[k]
        ]
        raise RepoError(f"{input}: the weights do not fit the OLMo-core model: {', '.join(wrong[:8])}")
    model.load_state_dict(core_state, strict=True, assign=True)
    tokenizer: dict[str, Any] = dict(
        vocab_size=hf_config.vocab_size,
        eos_token_id=hf_config.eos_token_id,
        pad_token_id=hf_config.pad_token_id,
        bos_token_id=hf_config.bos_token_id,
    )
    with staged_dir(output, force) as staging:
        if (input / "tokenizer.json").is_file():
            shutil.copyfile(input / "tokenizer.json", staging / "tokenizer.json")
            tokenizer["identifier"] = str(Path(output).resolve() / "tokenizer.json")
        config = {
            "model": model_config.as_config_dict(),
            "dataset": {"tokenizer": tokenizer},
            # the HF model's length, as a run records its own: core_to_hf gives it back to the HF config
            "train_module": {"max_sequence_length": hf_config.max_position_embeddings},
        }
        if extra := _hf_extra(hf_config):
            config[HF_EXTRA] = extra
        checkpoint.save_model(model, config, staging)
    return Path(output)
