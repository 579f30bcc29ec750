"""nltk 3.10.4: Punkt's data without a download.

lm-eval's RULER module (`lm_eval.tasks.ruler.prepare_niah`) downloads nltk's `punkt_tab` when it is imported
and finds none, and splits the essay haystack with it. `NLTK_DATA` is an nltk data folder whose
`tokenizers/punkt_tab/english/` holds an empty Punkt parameter set (no abbreviations, collocations or
sentence starters); `use_offline_punkt()` appends it to nltk's global search path (`nltk.data.path`), after
the standard folders: a real `punkt_tab` wins where one is installed, and nothing is downloaded. Sentences of
`olmo_repo.eval.essays` split the same way under any Punkt model.
"""

from __future__ import annotations

from pathlib import Path

import nltk

__all__ = ["NLTK_DATA", "use_offline_punkt"]

NLTK_DATA = Path(__file__).resolve().parent / "nltk_data"


def use_offline_punkt() -> None:
    """Let nltk find `punkt_tab` without a download (idempotent)."""
    if str(NLTK_DATA) not in nltk.data.path:
        nltk.data.path.append(str(NLTK_DATA))
