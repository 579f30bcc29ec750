"""OLMo-core checkpoints <-> Hugging Face directories (the Olmo 2 shape: `olmo2`, or `repo_olmo2` with RePo/NoPE).

- `core_to_hf(input, output)`: an OLMo-core checkpoint (a run's `stepN/` or a model-only one) -> an HF
  directory: config.json, safetensors, tokenizer, generation config and, for a model with RePo/NoPE layers,
  the modeling code as remote code (the same files and `auto_map` as `scripts/convert_to_hf.py` writes), so
  `scripts/eval.py`, the explorer, the analyses and vLLM take it as they take a converted ai2-olmo model.
- `hf_to_core(input, output)`: an HF `olmo2` / `repo_olmo2` / reference-format directory -> a model-only
  OLMo-core checkpoint, the `load_path` of a run (stage-1 initialisation).

Both directions copy tensors as they are (dtype as stored unless `dtype` is given): a round trip is bit-exact.
Outputs are written beside the target and renamed at the end (`olmo_repo.output.staged_dir`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from olmo_core.config import DType
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import Tensor
from transformers import GenerationConfig, Olmo2Config, Olmo2ForCausalLM, PreTrainedTokenizerFast

from ..errors import RepoError
from ..hf import DTYPES, RepoOlmo2Config, RepoOlmo2ForCausalLM, read_hf_config
from ..integrity import require_intact
from ..output import check_distinct, check_replaceable, staged_dir
from . import checkpoint
from .convert import core_config_from_hf, core_state_from_hf, hf_config_from_core, hf_state_from_core

__all__ = ["AUTO_MAP", "REMOTE_CODE", "core_to_hf", "hf_to_core"]

_PACKAGE = Path(__file__).resolve().parents[1]
# The remote code of a converted RePo checkpoint, as olmo_repo.hf.convert writes it (its modeling files with
# olmo_repo/rope.py and olmo_repo/modes.py beside them).
REMOTE_CODE = {
    "configuration_repo_olmo2.py": _PACKAGE / "hf" / "configuration_repo_olmo2.py",
    "modeling_repo_olmo2.py": _PACKAGE / "hf" / "modeling_repo_olmo2.py",
    "rope.py": _PACKAGE / "rope.py",
    "modes.py": _PACKAGE / "modes.py",
}
AUTO_MAP = {
    "AutoConfig": "configuration_repo_olmo2.RepoOlmo2Config",
    "AutoModel": "modeling_repo_olmo2.RepoOlmo2Model",
    "AutoModelForCausalLM": "modeling_repo_olmo2.RepoOlmo2ForCausalLM",
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


def _save_hf(config: Olmo2Config, state: dict[str, Tensor], tokenizer: Tokenizer, out: Path) -> None:
    """Build the HF model on the meta device, load the weights strictly (names and shapes) and save it."""
    cls = RepoOlmo2ForCausalLM if isinstance(config, RepoOlmo2Config) else Olmo2ForCausalLM
    with torch.device("meta"):
        model = cls(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    got = {k: v.shape for k, v in state.items()}
    if got != expected:
        wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
        raise RepoError(f"the converted weights do not fit the HF model: {', '.join(wrong[:8])}")
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    config.dtype = next(iter(state.values())).dtype
    if isinstance(config, RepoOlmo2Config):
        config.auto_map = dict(AUTO_MAP)
        for name, source in REMOTE_CODE.items():
            shutil.copyfile(source, out / name)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id
    )
    model.save_pretrained(out)
    token = lambda i: tokenizer.id_to_token(i) if i is not None else None  # noqa: E731
    eos, pad = token(config.eos_token_id), token(config.pad_token_id)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, pad_token=pad or eos).save_pretrained(
        out
    )


def core_to_hf(
    input: str | Path,
    output: str | Path,
    *,
    force: bool = False,
    dtype: str | None = None,
    tokenizer: str | None = None,
    max_position_embeddings: int | None = None,
) -> Path:
    """Convert an OLMo-core checkpoint to an HF directory; returns `output`. Everything is checked (config
    shape, tokenizer) before the weights are read, and nothing is written on an error."""
    if dtype is not None and dtype not in DTYPES:
        raise RepoError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    check_distinct(input, output)
    check_replaceable(output, force)
    config = checkpoint.read_config(input)
    model_config = checkpoint.model_config(input)
    tok = (config.get("dataset") or {}).get("tokenizer") or {}
    length = max_position_embeddings or (config.get("train_module") or {}).get("max_sequence_length") or 4096
    try:
        hf_config = hf_config_from_core(
            model_config,
            eos_token_id=tok.get("eos_token_id"),
            pad_token_id=tok.get("pad_token_id"),
            bos_token_id=tok.get("bos_token_id"),
            max_position_embeddings=int(length),
        )
    except ValueError as e:
        raise RepoError(f"{input}/config.json: {e}") from None
    identifier = tokenizer or tok.get("identifier")
    if identifier is None:
        raise RepoError(f"{input}/config.json has no dataset.tokenizer.identifier; pass --tokenizer")
    base = _tokenizer(identifier)
    model = checkpoint.load_model(input, model_config)
    state = hf_state_from_core(
        checkpoint.state_dict(model), model_config.n_layers, model_config.tie_word_embeddings
    )
    if dtype is not None:
        state = {k: v.to(DTYPES[dtype]) for k, v in state.items()}
    with staged_dir(output, force) as staging:
        _save_hf(hf_config, state, base, staging)
    return Path(output)


def _read_hf_weights(hf_dir: Path) -> dict[str, Tensor]:
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise RepoError(f"{hf_dir} has no *.safetensors weights")
    state: dict[str, Tensor] = {}
    for file in files:
        require_intact(file)
        state.update(load_file(file))
    return state


def hf_to_core(input: str | Path, output: str | Path, *, force: bool = False) -> Path:
    """Convert an HF Olmo2-shaped directory to a model-only OLMo-core checkpoint (`model_and_optim/`, a
    `config.json` with `model` and `dataset.tokenizer`, the tokenizer.json copied beside); returns `output`."""
    input = Path(input)
    check_distinct(input, output)
    check_replaceable(output, force)
    hf_config = read_hf_config(input)
    state = _read_hf_weights(input)
    dtype = next(iter(state.values())).dtype
    try:
        model_config = core_config_from_hf(hf_config, DType.from_pt(dtype))
        core_state = core_state_from_hf(state, hf_config.num_hidden_layers)
    except ValueError as e:
        raise RepoError(f"{input}: {e}") from None
    model = model_config.build(init_device="meta")
    if model_config.tie_word_embeddings:
        core_state["lm_head.w_out.weight"] = core_state["embeddings.weight"]
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if {k: v.shape for k, v in core_state.items()} != expected:
        wrong = sorted(k for k in set(expected) | set(core_state) if k not in core_state or k not in expected)
        raise RepoError(
            f"{input}: the weights do not fit the OLMo-core model: {', '.join(wrong[:8]) or 'shapes'}"
        )
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
        checkpoint.save_model(
            model, {"model": model_config.as_config_dict(), "dataset": {"tokenizer": tokenizer}}, staging
        )
    return Path(output)
