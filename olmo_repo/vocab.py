"""Whether two tokenizers give token ids the same meaning, from their `tokenizer.json` files alone.

Token files hold bare ids: the ids of another vocabulary are valid integers that mean other text, so a model
continued on them trains without an error, from a wrong start (the project's dolma2 data fed to Llama or Qwen).
A trainer compares the tokenizer its data was made with to the tokenizer of the model it continues before step 0
(`olmo_repo.olmocore.checks`). Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import RepoError

__all__ = ["vocabulary", "vocabulary_difference"]


def vocabulary(path: str | Path) -> dict[str, int]:
    """{token: id} of a `tokenizer.json`: its model's vocabulary (a dict for BPE and WordPiece, a list of
    [piece, score] for Unigram, ids by position) and its added tokens; `RepoError` naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        tokens = dict(vocab) if isinstance(vocab, dict) else {piece: i for i, (piece, _) in enumerate(vocab)}
        tokens.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RepoError(f"{path} is not a readable tokenizer.json ({type(e).__name__}: {e})") from None
    return tokens


def vocabulary_difference(a: str | Path, b: str | Path) -> str | None:
    """None when the tokenizers `a` and `b` map the same tokens to the same ids; else what differs, in a few
    words (the count and one example)."""
    va, vb = vocabulary(a), vocabulary(b)
    if va == vb:
        return None
    differ = sorted(t for t in va.keys() | vb.keys() if va.get(t) != vb.get(t))
    example = min(differ, key=lambda t: min(va.get(t, 1 << 62), vb.get(t, 1 << 62)))
    return (
        f"{len(differ)} of {len(va.keys() | vb.keys())} tokens differ, e.g. {example!r}: "
        f"id {va.get(example)} vs {vb.get(example)}"
    )
