"""Token files made from text with a model's own tokenizer (`scripts/tokenize_text.py`): the `--data-root` of a
run that continues that model (`configs/olmocore/smollm2-repo.py`, `Llama-3.2-1B-repo.py`, `Qwen3-0.6B-Base-repo.py`).

Token files hold bare ids, so the ids must be those of the tokenizer the model was trained with: the text is
encoded with the `tokenizer.json` of the model's directory (no special tokens added) and every document is
followed by the model's end id, the one a trainer's data-tokenizer check compares (`olmo_repo.vocab`,
`olmo_repo.olmocore.train`): an HF directory's `eos_token_id` (the first where it lists several), or what an
OLMo-core checkpoint records (`dataset.tokenizer.eos_token_id`: `scripts/core_convert_from_hf.py` records the HF
model's). The folder written is what the configs read and what OLMo-core's and ai2-olmo's numpy datasets read:

    train.npy       the ids as raw little-endian uint32 (no header: numpy memmap's layout), documents back to back
    tokenizer.json  the tokenizer they were made with (a copy), the configs' `dataset.tokenizer.identifier`

The text is UTF-8 files, one document each, or by default Python's own documentation as it ships with Python
(`pydoc_data.topics`: the reference manual's topics that `help()` shows, ~65,000 words of English about code; it
changes a little between Python versions). The folder is written whole or not at all (`olmo_repo.output`).
Imports only the `tokenizers` package (and numpy), when writing.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from ..errors import RepoError
from ..output import check_distinct, check_replaceable, staged_dir

__all__ = [
    "TOKENS_FILE",
    "Documents",
    "TokenFiles",
    "end_token_id",
    "model_files",
    "python_docs",
    "text_files",
    "tokenize_text",
]

TOKENS_FILE = "train.npy"
"""The token file's name: what the configs read under `--data-root`."""
_BATCH = 32  # documents encoded per call (the tokenizers package encodes a batch in parallel)


@dataclass(frozen=True)
class Documents:
    """Texts to tokenise, one document each, and where they come from (said in the summary)."""

    source: str
    texts: list[str]


@dataclass(frozen=True)
class TokenFiles:
    """What `tokenize_text` wrote: the folder, the count of documents and tokens (end ids included), the end id."""

    folder: Path
    documents: int
    tokens: int
    eos_token_id: int

    def summary(self, source: str) -> str:
        return (
            f"wrote {self.folder}: {self.tokens:,} tokens of {self.documents} documents ({source}), "
            f"each ended by id {self.eos_token_id}"
        )


def python_docs() -> Documents:
    """The topics of Python's documentation shipped with this Python (`pydoc_data.topics`), sorted by name."""
    from pydoc_data.topics import topics

    version = ".".join(map(str, sys.version_info[:3]))
    return Documents(
        f"Python {version}'s documentation, pydoc_data.topics", [topics[k] for k in sorted(topics)]
    )


def text_files(paths: list[str | PathLike]) -> Documents:
    """UTF-8 text files, one document each, in the order given; `RepoError` naming one that is missing, a folder,
    not UTF-8, or without text (it would be a document of the end id alone)."""
    texts = []
    for path in paths:
        try:
            texts.append(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RepoError(f"--text {path} does not exist") from None
        except IsADirectoryError:
            raise RepoError(f"--text {path} is a folder: name its files (one document each)") from None
        except UnicodeDecodeError as e:
            raise RepoError(f"--text {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not texts[-1].strip():
            raise RepoError(f"--text {path} holds no text (empty or only white space)")
    return Documents(f"{len(paths)} text file{'s' * (len(paths) != 1)}", texts)


def model_files(model: Path) -> tuple[Path, dict]:
    """The model folder's tokenizer.json and its config.json as a dict; `RepoError` naming what is missing."""
    if not model.exists():
        raise RepoError(f"--model {model} does not exist")
    if not model.is_dir():
        raise RepoError(f"--model {model} is not a directory (an HF model's, or an OLMo-core checkpoint's)")
    tokenizer, config = model / "tokenizer.json", model / "config.json"
    for path in (tokenizer, config):
        if not path.is_file():
            raise RepoError(f"--model {model} has no {path.name}; the text is tokenised with the model's own")
    try:
        return tokenizer, json.loads(config.read_text())
    except ValueError as e:
        raise RepoError(f"{config} is not JSON ({e})") from None


def end_token_id(config: dict, where: str | PathLike) -> int:
    """The end id a model's `config.json` states: an OLMo-core checkpoint's `dataset.tokenizer.eos_token_id`,
    else an HF config's `eos_token_id` (the first of a list); `RepoError` if it states none."""
    recorded = (config.get("dataset") or {}).get("tokenizer") if "dataset" in config else None
    eos = (recorded or {}).get("eos_token_id") if recorded is not None else config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if not isinstance(eos, int) or isinstance(eos, bool):
        raise RepoError(f"{where}/config.json states no end id (eos_token_id); pass --eos-token-id")
    return eos


def _encoded(tokenizer, texts: list[str], progress: bool) -> Iterator[list[int]]:
    """Each text's ids, no special tokens added, in batches (a progress bar over the documents)."""
    from tqdm import tqdm

    with tqdm(total=len(texts), desc="tokenising", unit="doc", disable=not progress, leave=False) as bar:
        for start in range(0, len(texts), _BATCH):
            batch = texts[start : start + _BATCH]
            for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
                yield encoding.ids
            bar.update(len(batch))


def tokenize_text(
    model: str | PathLike,
    output: str | PathLike,
    documents: Documents,
    *,
    eos_token_id: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> TokenFiles:
    """Tokenise `documents` with the tokenizer.json of `model` (an HF directory or an OLMo-core checkpoint) into
    `output`/train.npy, each document followed by the end id (`eos_token_id`, by default the model's:
    `end_token_id`), and copy the tokenizer.json beside it. Everything is checked before anything is written: a
    problem is a `RepoError` in one line and `output` is left as it was."""
    import numpy as np
    from tokenizers import Tokenizer

    model, output = Path(model), Path(output)
    check_distinct(model, output)
    check_replaceable(output, force)
    tokenizer_file, config = model_files(model)
    eos = end_token_id(config, model) if eos_token_id is None else eos_token_id
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as e:  # the tokenizers package raises a plain Exception for a malformed file
        raise RepoError(f"{tokenizer_file} is not a readable tokenizer.json ({e})") from None
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if not 0 <= eos < vocab_size:
        raise RepoError(f"end id {eos} is not a token of {tokenizer_file} (ids 0..{vocab_size - 1})")
    if not any(text.strip() for text in documents.texts):
        raise RepoError(f"{documents.source}: no text to tokenise")
    count = 0
    with staged_dir(output, force) as staging:
        with (staging / TOKENS_FILE).open("wb") as out:
            for ids in _encoded(tokenizer, documents.texts, progress):
                np.asarray([*ids, eos], dtype="<u4").tofile(out)
                count += len(ids) + 1
        shutil.copyfile(tokenizer_file, staging / "tokenizer.json")
    return TokenFiles(output, len(documents.texts), count, eos)
