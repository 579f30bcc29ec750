"""Conversions between this project's OLMo checkpoints and Hugging Face directories.

- `convert_to_hf(input, output)`: an unsharded OLMo checkpoint (`config.yaml` + `model.pt`; local, http(s)
  or s3://) -> an HF directory: `config.json`, safetensors, tokenizer, generation config and, for a model with
  RePo/NoPE layers, the modeling code (`auto_map`, loadable with `trust_remote_code=True` and nothing but
  transformers + torch). A model whose layers are all RoPE becomes a plain `olmo2` checkpoint. The input
  may also be a local HF directory in the reference implementation's format (an `olmo2` config.json with
  `pe_config`): it is re-written in this project's format.
- `as_hf_dir(path)`: what evaluation and analysis take as MODEL: an HF directory as is, or an OLMo checkpoint
  converted into a temporary directory for the duration of a `with` block.
- `convert_from_hf(input, output)`: an HF `olmo2` (stock, e.g. an OLMo-2 stage-1 revision), `repo_olmo2` or
  reference-format directory -> an unsharded OLMo checkpoint (`config.yaml`, `model.pt`, `train.pt` at step 0)
  usable as `load_path` (with `reset_optimizer_state: true`: there is no `optim.pt`) and by
  `olmo_repo.checkpoint.load_model`.

The weight maps are exact (no arithmetic): `att_proj` rows are (q, k, v); `ff_proj` halves are (up, gate);
`attn_norm`/`ff_norm` are HF's post-attention/post-feedforward norms. Both directions check every key and
shape against the model the config builds, so a wrong mapping fails loudly. Outputs are written to a
temporary directory beside the target and renamed at the end: a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from olmo.aliases import PathOrStr
from olmo.config import ActivationType, BlockType, LayerNormType, ModelConfig
from olmo.util import resource_path
from olmo_data import get_data_path, is_data_file
from omegaconf import OmegaConf as om
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import Tensor
from tqdm import tqdm
from transformers import GenerationConfig, Olmo2Config, Olmo2ForCausalLM, PreTrainedTokenizerFast

from ..checkpoint import require_intact
from ..config import PositionMode, RepoModelConfig, RepoTrainConfig, layer_modes
from ..registry import build_model
from .configuration_repo_olmo2 import RepoOlmo2Config, weight_names
from .modeling_repo_olmo2 import RepoOlmo2ForCausalLM

__all__ = [
    "as_hf_dir",
    "convert_from_hf",
    "convert_to_hf",
    "hf_config_from_olmo",
    "hf_state_dict_from_olmo",
    "olmo_config_from_hf",
    "olmo_state_dict_from_hf",
    "read_hf_config",
]

HF_DIR = Path(__file__).resolve().parent
# Remote code of a converted checkpoint: the modeling files, `olmo_repo/rope.py` and `olmo_repo/modes.py`.
REMOTE_CODE = {
    "configuration_repo_olmo2.py": HF_DIR / "configuration_repo_olmo2.py",
    "modeling_repo_olmo2.py": HF_DIR / "modeling_repo_olmo2.py",
    "rope.py": HF_DIR.parent / "rope.py",
    "modes.py": HF_DIR.parent / "modes.py",
}
AUTO_MAP = {
    "AutoConfig": "configuration_repo_olmo2.RepoOlmo2Config",
    "AutoModel": "modeling_repo_olmo2.RepoOlmo2Model",
    "AutoModelForCausalLM": "modeling_repo_olmo2.RepoOlmo2ForCausalLM",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Per-layer weights that map one to one: OLMo name -> HF name (under `model.layers.{i}.`).
_LAYER_KEYS = {
    "attn_out.weight": "self_attn.o_proj.weight",
    "q_norm.weight": "self_attn.q_norm.weight",
    "k_norm.weight": "self_attn.k_norm.weight",
    "attn_norm.weight": "post_attention_layernorm.weight",
    "ff_norm.weight": "post_feedforward_layernorm.weight",
    "ff_out.weight": "mlp.down_proj.weight",
    "gate_map.weight": "self_attn.gate_map.weight",
    "content_map.weight": "self_attn.content_map.weight",
    "final_map.weight": "self_attn.final_map.weight",
}
# Fused OLMo weights: their row blocks, in order, and the HF names of the blocks.
_FUSED_KEYS = {
    "att_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "ff_proj.weight": ("mlp.up_proj.weight", "mlp.gate_proj.weight"),
}
_TOP_KEYS = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "transformer.ff_out.weight": "lm_head.weight",
}
_OLMO_BLOCK = re.compile(r"transformer\.blocks\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Non-persistent RoPE buffers that old transformers versions (the reference's) saved with the weights.
_HF_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


# ----------------------------------------------------------------------------------------------- configs


def _check_olmo2_shape(config: ModelConfig) -> None:
    """Raise a ValueError naming the first OLMo setting that HF's Olmo2 cannot express."""
    required = {
        "norm_after": (config.norm_after, True),
        "attention_layer_norm": (config.attention_layer_norm, True),
        "layer_norm_type": (config.layer_norm_type, LayerNormType.rms),
        "layer_norm_with_affine": (config.layer_norm_with_affine, True),
        "attention_layer_norm_with_affine": (config.attention_layer_norm_with_affine, True),
        "include_bias": (config.include_bias, False),
        "bias_for_layer_norm": (bool(config.bias_for_layer_norm), False),
        "activation_type": (config.activation_type, ActivationType.swiglu),
        "block_type": (config.block_type, BlockType.sequential),
        "block_group_size": (config.block_group_size, 1),
        "rope": (config.rope, True),
        "alibi": (config.alibi, False),
        "clip_qkv": (config.clip_qkv, None),
        "scale_logits": (config.scale_logits, False),
        "embedding_layer_norm": (config.embedding_layer_norm, False),
    }
    for key, (value, allowed) in required.items():
        if value != allowed:
            raise ValueError(f"model.{key}={value} has no Hugging Face Olmo2 equivalent; allowed: {allowed}")


def hf_config_from_olmo(config: ModelConfig) -> Olmo2Config:
    """The HF config of an OLMo-2-shaped model: `Olmo2Config` if every layer is RoPE, else `RepoOlmo2Config`."""
    _check_olmo2_shape(config)
    mlp_hidden = config.mlp_hidden_size or config.mlp_ratio * config.d_model
    kwargs = dict(
        vocab_size=config.embedding_size or config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=mlp_hidden // 2,  # SwiGLU: ff_proj gives (up, gate), each half of mlp_hidden
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.effective_n_kv_heads,
        max_position_embeddings=config.max_sequence_length,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        rms_norm_eps=config.layer_norm_eps,
        tie_word_embeddings=config.weight_tying,
        bos_token_id=None,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        initializer_range=config.init_std,
        attention_dropout=config.attention_dropout,
    )
    if all(mode == PositionMode.rope for mode in layer_modes(config)):
        return Olmo2Config(**kwargs)
    return RepoOlmo2Config(
        **kwargs,
        pe_mode=str(config.pe_mode),
        pe_start_layer=config.pe_start_layer,
        pe_layer_ids=list(config.pe_layer_ids) if config.pe_layer_ids is not None else None,
    )


def olmo_config_from_hf(config: Olmo2Config, vocab_size: int | None = None) -> RepoModelConfig:
    """The OLMo model config of an HF Olmo2/RepoOlmo2 config. `vocab_size`: the tokenizer's (defaults to the
    embedding size, which is HF's `vocab_size`)."""
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"rope_parameters.rope_type={rope['rope_type']!r} has no OLMo equivalent; allowed: default "
            "(YaRN and other scalings are an inference-time setting of the HF model)"
        )
    if config.hidden_act != "silu" or config.attention_bias:
        raise ValueError(
            f"hidden_act={config.hidden_act!r}, attention_bias={config.attention_bias} have no OLMo-2 equivalent; "
            "allowed: silu, false"
        )
    for name in ("eos_token_id", "pad_token_id"):
        if not isinstance(getattr(config, name), int | None):
            raise ValueError(f"{name}={getattr(config, name)!r} must be one token id for OLMo")
    theta = float(rope.get("rope_theta", 10_000.0))
    if not theta.is_integer():
        raise ValueError(
            f"rope_parameters.rope_theta={theta} must be an integer for OLMo (model.rope_theta: int)"
        )
    pe = {}
    if isinstance(config, RepoOlmo2Config):
        pe = dict(
            pe_mode=config.pe_mode, pe_start_layer=config.pe_start_layer, pe_layer_ids=config.pe_layer_ids
        )
    n_kv = config.num_key_value_heads
    return RepoModelConfig(
        d_model=config.hidden_size,
        n_heads=config.num_attention_heads,
        n_kv_heads=None if n_kv == config.num_attention_heads else n_kv,
        n_layers=config.num_hidden_layers,
        mlp_hidden_size=2 * config.intermediate_size,
        activation_type=ActivationType.swiglu,
        block_type=BlockType.sequential,
        rope=True,
        rope_theta=int(theta),
        attention_layer_norm=True,
        norm_after=True,
        layer_norm_type=LayerNormType.rms,
        layer_norm_with_affine=True,
        attention_layer_norm_with_affine=True,
        layer_norm_eps=config.rms_norm_eps,
        bias_for_layer_norm=False,
        include_bias=False,
        weight_tying=config.tie_word_embeddings,
        max_sequence_length=config.max_position_embeddings,
        vocab_size=vocab_size or config.vocab_size,
        embedding_size=config.vocab_size,
        eos_token_id=config.eos_token_id if config.eos_token_id is not None else 0,
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0,
        attention_dropout=config.attention_dropout,
        residual_dropout=0.0,
        embedding_dropout=0.0,
        init_device="cpu",
        init_fn="normal",
        init_std=config.initializer_range,
        init_cutoff_factor=3,
        **pe,
    )


def read_hf_config(hf_dir: PathOrStr) -> Olmo2Config:
    """The config of an HF directory: `repo_olmo2` (this project), stock `olmo2`, or `olmo2` with the
    reference's `pe_config` (-> `RepoOlmo2Config` through `RepoOlmo2Config.dict_from_reference`, checked
    against the layers that carry RePo weights; `Olmo2Config` if it selects no RePo/NoPE layer)."""
    raw = json.loads((Path(hf_dir) / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in ("olmo2", RepoOlmo2Config.model_type):
        raise ValueError(f"{hf_dir}: model_type={model_type!r} is not supported; allowed: olmo2, repo_olmo2")
    if "pe_config" in raw:
        raw = RepoOlmo2Config.dict_from_reference(raw, weight_names(hf_dir), str(hf_dir))
    for key in ("model_type", "auto_map", "architectures", "transformers_version"):
        raw.pop(key, None)
    if model_type == RepoOlmo2Config.model_type or raw.get("pe_mode", "rope") != "rope":
        return RepoOlmo2Config.from_dict(raw)
    return Olmo2Config.from_dict({k: v for k, v in raw.items() if not k.startswith("pe_")})


# ----------------------------------------------------------------------------------------------- weights


def hf_state_dict_from_olmo(state_dict: dict[str, Tensor], config: Olmo2Config) -> dict[str, Tensor]:
    """OLMo names -> HF names. Fused weights are split into separate tensors (copies, for safetensors)."""
    q_rows = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    kv_rows = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    splits = {"att_proj.weight": [q_rows, kv_rows, kv_rows], "ff_proj.weight": [config.intermediate_size] * 2}
    out: dict[str, Tensor] = {}
    for key, tensor in tqdm(state_dict.items(), desc="mapping OLMo -> HF", unit="tensor"):
        if key in _TOP_KEYS:
            out[_TOP_KEYS[key]] = tensor
            continue
        match = _OLMO_BLOCK.fullmatch(key)
        if match is None:
            raise KeyError(f"OLMo weight {key!r} has no Hugging Face equivalent")
        prefix, name = f"model.layers.{match[1]}.", match[2]
        if name in _FUSED_KEYS:
            for hf_name, part in zip(_FUSED_KEYS[name], tensor.split(splits[name], dim=0), strict=True):
                out[prefix + hf_name] = part.clone()
        elif name in _LAYER_KEYS:
            out[prefix + _LAYER_KEYS[name]] = tensor
        else:
            raise KeyError(f"OLMo weight {key!r} has no Hugging Face equivalent")
    return out


def olmo_state_dict_from_hf(state_dict: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """HF names -> OLMo names; the fused OLMo weights are concatenated back (exact)."""
    top = {hf: olmo for olmo, hf in _TOP_KEYS.items()}
    per_layer = {hf: olmo for olmo, hf in _LAYER_KEYS.items()}
    out: dict[str, Tensor] = {}
    for key, tensor in state_dict.items():
        if key in top:
            out[top[key]] = tensor
        elif (match := _HF_LAYER.fullmatch(key)) and match[2] in per_layer:
            out[f"transformer.blocks.{match[1]}.{per_layer[match[2]]}"] = tensor
        elif not (match and any(match[2] in parts for parts in _FUSED_KEYS.values())):
            raise KeyError(f"Hugging Face weight {key!r} has no OLMo equivalent")
    for i in tqdm(range(n_layers), desc="mapping HF -> OLMo", unit="layer"):
        for olmo_name, hf_names in _FUSED_KEYS.items():
            parts = [state_dict.get(f"model.layers.{i}.{name}") for name in hf_names]
            if any(p is None for p in parts):
                raise KeyError(f"layer {i}: {olmo_name} needs {', '.join(hf_names)}")
            out[f"transformer.blocks.{i}.{olmo_name}"] = torch.cat(parts, dim=0)
    return out


def _read_hf_state_dict(hf_dir: Path) -> dict[str, Tensor]:
    files = sorted(hf_dir.glob("*.safetensors")) or sorted(hf_dir.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"{hf_dir} has no *.safetensors or pytorch_model*.bin weights")
    state_dict: dict[str, Tensor] = {}
    for file in tqdm(files, desc="reading HF weights", unit="file"):
        require_intact(file)
        shard = (
            load_file(file)
            if file.suffix == ".safetensors"
            else torch.load(file, map_location="cpu", weights_only=True)
        )
        state_dict.update({k: v for k, v in shard.items() if not _HF_IGNORED.fullmatch(k)})
    return state_dict


def _check_against(state_dict: dict[str, Tensor], expected: dict[str, Tensor], what: str) -> None:
    """Keys and shapes of `state_dict` must be exactly those of `expected` (a meta-device model's)."""
    missing, unexpected = (
        sorted(expected.keys() - state_dict.keys()),
        sorted(state_dict.keys() - expected.keys()),
    )
    if missing or unexpected:
        raise KeyError(f"{what}: missing weights {missing[:8]}, unexpected weights {unexpected[:8]}")
    for key, tensor in state_dict.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"{what}: {key} has shape {tuple(tensor.shape)}, the config needs {tuple(expected[key].shape)}"
            )


# ------------------------------------------------------------------------------------------------ output


@contextmanager
def _staged_dir(output: PathOrStr, force: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `output`; on success it replaces `output`, on failure it is removed."""
    output = Path(output)
    if output.exists() and not force:
        raise FileExistsError(f"{output} exists; pass --force (force=True) to replace it")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        yield staging
        _apply_umask(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        output.rename(old)
        staging.rename(output)
        shutil.rmtree(old)
    else:
        staging.rename(output)


def _apply_umask(root: Path) -> None:
    """Give the output the permissions of anything else the user creates: mkdtemp makes the folder 0700, and
    transformers writes safetensors through a private temporary file (0600), whatever the umask."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _check_distinct(input: PathOrStr, output: PathOrStr) -> None:
    if "://" not in str(input) and Path(input).resolve() == Path(output).resolve():
        raise ValueError(f"--output {output} is the input directory")


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


def _save_tokenizer(base: Tokenizer, config: Olmo2Config, out: Path) -> None:
    """Save `base` as a transformers tokenizer with the model's eos/pad tokens."""
    token = lambda i: base.id_to_token(i) if i is not None and i < base.get_vocab_size() else None  # noqa: E731
    eos, pad = token(config.eos_token_id), token(config.pad_token_id)
    PreTrainedTokenizerFast(tokenizer_object=base, eos_token=eos, pad_token=pad or eos).save_pretrained(out)


def _save_hf(
    config: Olmo2Config, state_dict: dict[str, Tensor], out: Path, dtype: torch.dtype | None
) -> None:
    """Build the HF model on the meta device, load the weights strictly (checks names and shapes) and save."""
    if dtype is not None:
        state_dict = {k: v.to(dtype) for k, v in state_dict.items()}
    model_cls = RepoOlmo2ForCausalLM if isinstance(config, RepoOlmo2Config) else Olmo2ForCausalLM
    with torch.device("meta"):
        model = model_cls(config)
    expected = {
        k: v
        for k, v in model.state_dict().items()
        if not (config.tie_word_embeddings and k == "lm_head.weight")
    }
    _check_against(state_dict, expected, "HF model")
    model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    config.dtype = next(iter(state_dict.values())).dtype
    if isinstance(config, RepoOlmo2Config):
        config.auto_map = dict(AUTO_MAP)
        for name, source in REMOTE_CODE.items():
            shutil.copyfile(source, out / name)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id
    )
    model.save_pretrained(out)  # config.json, safetensors (sharded when large), generation_config.json


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
    _check_distinct(input, output)
    if Path(output).exists() and not force:
        raise FileExistsError(f"{output} exists; pass --force (force=True) to replace it")
    torch_dtype = DTYPES[dtype] if dtype else None
    if "://" not in str(input) and (Path(input) / "config.json").is_file():
        return _reference_to_hf(Path(input), Path(output), force, torch_dtype, tokenizer)

    train_config = om.load(resource_path(input, "config.yaml"))
    model_config = RepoModelConfig.load(
        resource_path(input, "config.yaml"), key="model", validate_paths=False
    )
    hf_config = hf_config_from_olmo(model_config)  # fails on unsupported configs before any heavy work
    identifier = tokenizer or om.select(train_config, "tokenizer.identifier", default=None)
    if identifier is None:
        raise ValueError(f"{input}/config.yaml has no tokenizer.identifier; pass --tokenizer")
    base_tokenizer = _load_tokenizer(identifier)

    model_config.init_device = "meta"
    olmo = build_model(model_config)
    local = resource_path(input, "model.pt")
    require_intact(local)
    state_dict = torch.load(local, map_location="cpu", weights_only=True, mmap=True)
    state_dict = olmo._make_state_dict_compatible(state_dict)[0]
    _check_against(state_dict, olmo.state_dict(), "OLMo checkpoint")
    hf_state_dict = hf_state_dict_from_olmo(state_dict, hf_config)
    with _staged_dir(output, force) as staging:
        _save_hf(hf_config, hf_state_dict, staging, torch_dtype)
        _save_tokenizer(base_tokenizer, hf_config, staging)
    return Path(output)


def _reference_to_hf(
    input: Path, output: Path, force: bool, dtype: torch.dtype | None, tokenizer: str | None
) -> Path:
    """A reference-format (or any Olmo2) HF dir -> this project's format; same weight names."""
    config = read_hf_config(input)
    base_tokenizer = _load_tokenizer(tokenizer) if tokenizer is not None else None
    state_dict = _read_hf_state_dict(input)
    with _staged_dir(output, force) as staging:
        _save_hf(config, state_dict, staging, dtype)
        if base_tokenizer is not None:
            _save_tokenizer(base_tokenizer, config, staging)
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
    _check_distinct(input, output)
    if Path(output).exists() and not force:
        raise FileExistsError(f"{output} exists; pass --force (force=True) to replace it")
    hf_config = read_hf_config(input)
    vocab_size = None
    if (input / "tokenizer.json").is_file():
        vocab_size = _load_tokenizer(str(input / "tokenizer.json")).get_vocab_size()
    model_config = olmo_config_from_hf(hf_config, vocab_size)
    state_dict = olmo_state_dict_from_hf(_read_hf_state_dict(input), hf_config.num_hidden_layers)
    if hf_config.tie_word_embeddings:
        state_dict.pop("transformer.ff_out.weight", None)
    model_config.init_device = "meta"
    _check_against(state_dict, build_model(model_config).state_dict(), "converted OLMo model")
    model_config.init_device = "cpu"
    train_config = RepoTrainConfig(model=model_config)
    if (input / "tokenizer.json").is_file():
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
    with _staged_dir(output, force) as staging:
        train_config.save(staging / "config.yaml")
        torch.save(state_dict, staging / "model.pt")
        torch.save(trainer_state, staging / "train.pt")
        if (input / "tokenizer.json").is_file():
            shutil.copyfile(input / "tokenizer.json", staging / "tokenizer.json")
    return Path(output)


@contextmanager
def as_hf_dir(path: PathOrStr, *, tokenizer: str | None = None) -> Iterator[Path]:
    """Yield an HF directory for `path`: `path` itself if it holds a config.json (this project's, a stock HF
    model's or the reference's format), else an unsharded OLMo checkpoint of this project (config.yaml +
    model.pt; local, http(s) or s3) converted into a temporary directory that is removed on exit.

    Raises FileNotFoundError naming `path` when it is neither.
    """
    if "://" not in str(path):
        local = Path(path)
        if (local / "config.json").is_file():
            yield local
            return
        if not (local / "config.yaml").is_file() or not (local / "model.pt").is_file():
            raise FileNotFoundError(
                f"{path}: not a model directory; expected a Hugging Face directory (config.json) or an "
                "unsharded OLMo checkpoint of this project (config.yaml and model.pt)"
            )
    with tempfile.TemporaryDirectory(prefix="olmo-repo-hf-") as tmp:
        yield convert_to_hf(path, Path(tmp) / "hf", tokenizer=tokenizer)
