"""ai2-olmo checkpoints of this project <-> Hugging Face directories (OLMo-core's: `olmo_repo.olmocore.hf`).

- `convert_to_hf(input, output)`: an unsharded OLMo checkpoint (`config.yaml` + `model.pt`; local, http(s)
  or s3://) -> an HF directory: `config.json`, safetensors, tokenizer, generation config and, for a model with
  RePo/NoPE layers, the modeling code (`auto_map`, loadable with `trust_remote_code=True` and nothing but
  transformers + torch). A model whose layers are all RoPE becomes a plain `olmo2` checkpoint. A run with
  an index blend records its schedule (`pe_blend_init`, `pe_blend_steps`) and the p of the checkpoint's
  step (`pe_blend`, from train.pt), so the HF model scores as training did at that step. The input
  may also be a local HF directory in the reference implementation's format (an `olmo2` config.json with
  `pe_config`): it is re-written in this project's format.
- `convert_from_hf(input, output)`: an HF `olmo2` (stock, e.g. an OLMo-2 stage-1 revision), `repo_olmo2` or
  reference-format directory -> an unsharded OLMo checkpoint (`config.yaml`, `model.pt`, `train.pt` at step 0;
  the blend's schedule carried back, which a run starts at step 0)
  usable as `load_path` (with `reset_optimizer_state: true`: there is no `optim.pt`) and by
  `olmo_repo.checkpoint.load_model`.

The maps themselves are `olmo_repo.ai2olmo.convert`; a command that takes MODEL converts an ai2-olmo
checkpoint on the fly with `olmo_repo.checkpoint.as_hf_dir`. Outputs are written to a temporary directory beside the
target and renamed at the end (`olmo_repo.output.staged_dir`): a failure leaves nothing behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from huggingface_hub import hf_hub_download
from olmo.aliases import PathOrStr
from olmo.util import resource_path
from olmo_data import get_data_path, is_data_file
from omegaconf import DictConfig
from omegaconf import OmegaConf as om
from tokenizers import Tokenizer

from ..errors import CorruptFileError
from ..hf import DTYPES
from ..hf.files import (
    as_stock,
    carried,
    check_state_dict,
    over_stock,
    read_hf_state_dict,
    save_hf,
    save_tokenizer,
    tokenizer_beside,
)
from ..hf.formats import read_hf_config
from ..integrity import require_intact
from ..output import check_distinct, check_replaceable, staged_dir
from ..paths import is_url
from ..upstream.olmo import make_state_dict_compatible
from .checkpoint import trained_steps
from .config import RepoModelConfig, RepoTrainConfig
from .convert import (
    hf_config_from_olmo,
    hf_state_dict_from_olmo,
    olmo_config_from_hf,
    olmo_state_dict_from_hf,
)
from .registry import build_model

__all__ = ["convert_from_hf", "convert_to_hf", "recorded_stock"]


def _load_tokenizer(identifier: str) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json path, an `olmo_data` file, or a Hub id."""
    if Path(identifier).is_file():
        return Tokenizer.from_file(identifier)
    if is_data_file(identifier):
        with get_data_path(identifier) as path:
            return Tokenizer.from_file(str(path))
    try:  # a Hub id, through huggingface_hub (honours HF_HUB_OFFLINE and the local cache)
        return Tokenizer.from_file(hf_hub_download(identifier, "tokenizer.json"))
    except Exception as e:
        raise ValueError(
            f"tokenizer {identifier!r} is neither a tokenizer.json file, a file of olmo_data (e.g. "
            f"tokenizers/allenai_dolma2.json) nor a Hub repository that can be reached: {e}"
        ) from e


# ------------------------------------------------------------------------------------------- conversions


def convert_to_hf(
    input: PathOrStr,
    output: PathOrStr,
    *,
    force: bool = False,
    dtype: str | None = None,
    tokenizer: str | None = None,
) -> Path:
    """Convert an OLMo checkpoint (or a reference-format HF dir) to an HF directory. Returns `output`.

    dtype: float32 | bfloat16 | float16 (default: as stored). tokenizer: a tokenizer.json path, an
    `olmo_data` file or a Hub id (default: the checkpoint's `tokenizer.identifier`; a reference-format
    input keeps its own tokenizer files).
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    check_distinct(input, output)
    check_replaceable(output, force)  # before any heavy work
    torch_dtype = DTYPES[dtype] if dtype else None
    if not is_url(input) and (Path(input) / "config.json").is_file():
        return _reference_to_hf(Path(input), Path(output), force, torch_dtype, tokenizer)

    train_config = om.load(resource_path(input, "config.yaml"))
    model_config = RepoModelConfig.load(
        resource_path(input, "config.yaml"), key="model", validate_paths=False
    )
    # fails on unsupported configs before any heavy work; over the stock model's config the run continued
    stock = om.select(train_config, "hf_config", default=None)
    hf_config = over_stock(
        hf_config_from_olmo(model_config, trained_steps(input, model_config)),
        om.to_container(stock) if stock is not None else None,
    )
    identifier = tokenizer or om.select(train_config, "tokenizer.identifier", default=None)
    if identifier is None:
        raise ValueError(f"{input}/config.yaml has no tokenizer.identifier; pass --tokenizer")
    base_tokenizer = _load_tokenizer(identifier)

    model_config.init_device = "meta"
    olmo = build_model(model_config)
    local = resource_path(input, "model.pt")
    require_intact(local)
    state_dict = torch.load(local, map_location="cpu", weights_only=True, mmap=True)
    state_dict = make_state_dict_compatible(olmo, state_dict)
    check_state_dict(state_dict, olmo.state_dict(), "OLMo checkpoint")
    hf_state_dict = hf_state_dict_from_olmo(state_dict, hf_config)
    with staged_dir(output, force) as staging:
        save_hf(hf_config, hf_state_dict, staging, torch_dtype)
        save_tokenizer(base_tokenizer, hf_config, staging)
    return Path(output)


def recorded_stock(checkpoint: PathOrStr | None) -> dict[str, Any] | None:
    """The config of the HF model the checkpoint (local, or a URL ai2-olmo reads: s3://, gs://, ...) continues
    (its config.yaml's `hf_config`), as a run carries it; None where it records none."""
    if checkpoint is None:
        return None
    if is_url(checkpoint):
        try:
            file = resource_path(str(checkpoint), "config.yaml")
        except FileNotFoundError:
            return None
    elif not (file := Path(str(checkpoint), "config.yaml")).is_file():
        return None
    where = f"{str(checkpoint).rstrip('/')}/config.yaml"
    try:
        config = om.load(file)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{where} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, DictConfig):
        raise CorruptFileError(
            f"{where} is not a checkpoint's config (a YAML mapping): a {type(config).__name__}"
        )
    stock = om.select(config, "hf_config", default=None)
    return carried(om.to_container(stock)) if stock is not None else None


def _reference_to_hf(
    input: Path, output: Path, force: bool, dtype: torch.dtype | None, tokenizer: str | None
) -> Path:
    """A reference-format (or any Olmo2) HF dir -> this project's format; same weight names."""
    config = read_hf_config(input)
    base_tokenizer = _load_tokenizer(tokenizer) if tokenizer is not None else None
    state_dict = read_hf_state_dict(input)
    with staged_dir(output, force) as staging:
        save_hf(config, state_dict, staging, dtype)
        if base_tokenizer is not None:
            save_tokenizer(base_tokenizer, config, staging)
        else:
            for file in input.iterdir():
                if file.name.startswith(("tokenizer", "special_tokens_map", "vocab", "merges")):
                    shutil.copyfile(file, staging / file.name)
    return output


def convert_from_hf(input: PathOrStr, output: PathOrStr, *, force: bool = False) -> Path:
    """Convert an HF Olmo2 / RepoOlmo2 / reference-format directory to an unsharded OLMo checkpoint.

    Writes `config.yaml` (a `RepoTrainConfig` whose `model` is the converted config; the OLMo `vocab_size` is
    the tokenizer's when the directory has one), `model.pt` (tensors bit-exact, dtype as stored) and
    `train.pt` (a fresh trainer state at step 0). Returns `output`.
    """
    input = Path(input)
    check_distinct(input, output)
    check_replaceable(output, force)  # before any heavy work
    hf_config = read_hf_config(input)
    tokenizer = tokenizer_beside(input)
    vocab_size = _load_tokenizer(str(tokenizer)).get_vocab_size() if tokenizer else None
    model_config = olmo_config_from_hf(hf_config, vocab_size)
    state_dict = olmo_state_dict_from_hf(read_hf_state_dict(input), hf_config.num_hidden_layers)
    if hf_config.tie_word_embeddings:
        state_dict.pop("transformer.ff_out.weight", None)
    model_config.init_device = "meta"
    check_state_dict(state_dict, build_model(model_config).state_dict(), "converted OLMo model")
    model_config.init_device = "cpu"
    train_config = RepoTrainConfig(
        model=model_config, hf_config=as_stock(hf_config)
    )  # convert_to_hf keeps it
    if tokenizer:
        # The copy written beside model.pt; a training config names its own tokenizer anyway.
        train_config.tokenizer.identifier = str(Path(output).resolve() / "tokenizer.json")
    trainer_state = dict(
        global_step=0,
        epoch=0,
        global_train_examples_seen_this_epoch=0,
        global_train_tokens_seen=0,
        checkpoints=[],
        unsharded_checkpoints=[],
        ephemeral_checkpoints=[],
    )
    with staged_dir(output, force) as staging:
        train_config.save(staging / "config.yaml")
        torch.save(state_dict, staging / "model.pt")
        torch.save(trainer_state, staging / "train.pt")
        if tokenizer:
            shutil.copyfile(tokenizer, staging / "tokenizer.json")
    return Path(output)
