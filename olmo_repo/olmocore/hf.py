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

A checkpoint of a stock HF model records that model's config (`HF_CONFIG`) and a run carries it into every
checkpoint it saves: converted back, the run's weights and RePo keys come with the stock model's context length,
token ids and every other key of its config (a model trained from scratch has none: its training length stands).

Both directions copy tensors as they are (dtype as stored unless `dtype` is given): a round trip is bit-exact.
Outputs are written beside the target and renamed at the end (`olmo_repo.output.staged_dir`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from olmo_core.config import DType
from tokenizers import Tokenizer
from transformers import (
    PreTrainedTokenizerFast,
)

from ..errors import RepoError
from ..hf import DTYPES, read_hf_config
from ..hf.files import (
    as_stock,
    carried,
    context_length,
    over_stock,
    read_hf_state_dict,
    save_hf,
    save_tokenizer,
    tokenizer_beside,
)
from ..hf.formats import ALL_MODEL_TYPES
from ..output import check_distinct, check_replaceable, staged_dir
from ..paths import is_url
from . import checkpoint
from .attention import index_blend_at
from .convert import core_config_from_hf, hf_config_from_core, state_from_hf, state_to_hf

__all__ = ["HF_CONFIG", "core_to_hf", "hf_to_core", "recorded_stock"]

HF_CONFIG = "hf_config"
"""The checkpoint config.json key of the config of the HF model a checkpoint continues, whole (its context
length, token ids, keys no OLMo-core config has a place for, e.g. SmolLM2's `is_llama_config`, and what its RePo
layers score with): recorded by `hf_to_core`, carried by a run into each of its checkpoints (without the scoring
keys: `olmo_repo.hf.files.carried`), so that `core_to_hf` gives the stock model's config back with the run's
weights and RePo keys (`olmo_repo.hf.files.over_stock`)."""
HF_EXTRA = "hf_config_extra"
"""What checkpoints converted before `HF_CONFIG` recorded: the keys its class does not define, and the scoring
keys; read as `HF_CONFIG` is."""


def recorded_stock(path: str | Path) -> dict[str, Any] | None:
    """The config of the HF model the checkpoint `path` (local, or a URL OLMo-core reads: s3://, gs://, ...)
    continues (`HF_CONFIG`), as a run carries it; None where it records none (a model trained from scratch, or a
    checkpoint of no config)."""
    if is_url(str(path)):
        url = f"{str(path).rstrip('/')}/{checkpoint.CONFIG}"
        if (file := checkpoint.fetch_file(url)) is None:
            return None
        config = checkpoint.parse_config(file.read_bytes(), url)
    elif (Path(path) / checkpoint.CONFIG).is_file():
        config = checkpoint.read_config(path)
    else:
        return None
    stock = config.get(HF_CONFIG) or config.get(HF_EXTRA)
    return carried(stock) if stock else None


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
    """Convert an OLMo-core checkpoint to an HF directory; returns `output`. Over the config of the stock HF
    model the checkpoint continues, where it records one (`HF_CONFIG`: `olmo_repo.hf.files.over_stock`): its
    `max_position_embeddings` is the longer of the stock model's and the training length the checkpoint records
    (`train_module.max_sequence_length`), which alone stands for a model trained from scratch;
    `max_position_embeddings`, given, is the length outright. Everything is checked
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
    stock = config.get(HF_CONFIG) or config.get(HF_EXTRA)
    length = (config.get("train_module") or {}).get("max_sequence_length") or max_position_embeddings
    if not length and not (stock or {}).get("max_position_embeddings"):
        # no default: an HF config's max_position_embeddings is the length evaluation extends from
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
            max_position_embeddings=context_length(int(length or 0), stock, max_position_embeddings),
            pe_blend=index_blend_at(model_config, checkpoint.steps_done(input)),
        )
    except ValueError as e:
        raise RepoError(f"{input}/config.json: {e}") from None
    hf_config = over_stock(hf_config, stock, max_position_embeddings)
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
    (`model_and_optim/`, a `config.json` with `model`, `dataset.tokenizer`, the HF model's length as
    `train_module.max_sequence_length` and its config whole as `HF_CONFIG`, the tokenizer.json copied beside);
    returns `output`. The weights are the
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
    tokenizer_file = tokenizer_beside(input)
    with staged_dir(output, force) as staging:
        if tokenizer_file:
            shutil.copyfile(tokenizer_file, staging / "tokenizer.json")
            tokenizer["identifier"] = str(Path(output).resolve() / "tokenizer.json")
        config = {
            "model": model_config.as_config_dict(),
            "dataset": {"tokenizer": tokenizer},
            # the HF model's length, as a run records its own: core_to_hf gives it back to the HF config
            "train_module": {"max_sequence_length": hf_config.max_position_embeddings},
        }
        config[HF_CONFIG] = as_stock(hf_config)  # the stock model, whole: core_to_hf gives it back
        checkpoint.save_model(model, config, staging)
    return Path(output)
