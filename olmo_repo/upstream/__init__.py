"""Every place this project reaches into an upstream library's internals, one module per library.

Upgrading a library means reading its module here and running its canaries (`tests/test_upstream.py`),
which fail when the pinned version's patched, restated or private thing changes (a source hash or a
signature), instead of letting the project fall back silently:

    olmo.py          ai2-olmo 0.6.0: the block factory, the attention internals the RePo block calls,
                     the trainer's cancel check, state-dict compatibility, the fused-loss probe
    torch.py         torch 2.13 / olmo_core 0.1.0 / numpy 1.26: what ai2-olmo 0.6.0 assumes of them
    wandb.py         wandb 0.31: the hooks `wandb.init` installs, `finish` without `quiet`
    transformers.py  transformers 5.24: the `olmo2` Auto routing for the reference format, the private
                     names the HF side reads
    lm_eval.py       lm-eval 0.4.13: RULER's generator and scorer, the task YAML loader, its log level
    nltk.py          nltk 3.10: the offline Punkt data RULER needs
    python.py        CPython 3.10-3.13: the steps of the interpreter's exit a finished command keeps
                     (`olmo_repo.cli.command`), without its module teardown
    vllm.py          vllm 0.32 (its own environment, .venv-vllm): the Olmo2 layers the RePo model reuses
    olmo_core.py     ai2-olmo-core 3.0 (its own environment, .venv-core): the attention internals the RePo
                     attention of the OLMo-core side overrides and extends
    datatrove.py     datatrove 0.10.1 (its own environment, .venv-data): the tokenizer stage of data
                     preparation (uint32, the model's end id, nothing truncated) and its shards' names

Each module is imported by the code that needs it; none patches anything at import. The two registrations
that do happen at import are stated where they happen: `olmo_repo.ai2olmo.registry.install()` (OLMo's block
factory, on first use of the OLMo side) and `import olmo_repo.hf` (transformers' Auto classes).
Remote code in converted checkpoints cannot import this package: the two private transformers names it
reads are marked in place and covered by the same canaries.
"""

from __future__ import annotations

import hashlib
import inspect
from importlib import import_module
from typing import Any

__all__ = ["resolve", "source_hash"]


def resolve(dotted: str) -> Any:
    """The object a dotted name refers to: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"nothing importable in {dotted!r}")


def source_hash(dotted: str) -> str:
    """The first 16 hex digits of the sha256 of an upstream object's source: a canary's fingerprint."""
    return hashlib.sha256(inspect.getsource(resolve(dotted)).encode()).hexdigest()[:16]
