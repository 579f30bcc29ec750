"""The OLMo-core environment: OLMo-core 3 with the pinned torch, and the project without ai2-olmo."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from importlib.metadata import version

import pytest


def test_versions_are_the_pinned_ones():
    assert version("ai2-olmo-core") == "3.0.0"
    assert version("torch").split("+")[0] == "2.13.0"


@pytest.mark.slow  # a fresh interpreter importing everything
def test_project_imports_without_ai2_olmo():
    """`import olmo_repo`, its HF side and its OLMo-core side load in a fresh process; ai2-olmo is absent and
    the ai2-olmo side is not imported."""
    assert importlib.util.find_spec("olmo") is None
    code = (
        "import sys, olmo_repo, olmo_repo.hf, olmo_repo.olmocore, olmo_repo.rope, olmo_repo.modes; "
        "print(sorted(m for m in sys.modules if m == 'olmo' or m.startswith('olmo.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_olmo_core_internals_the_repo_attention_relies_on_are_the_pinned_ones():
    """An OLMo-core upgrade changes these: re-read olmo_repo/upstream/olmo_core.py and
    olmo_repo/olmocore/attention.py against the new code, then re-pin."""
    from olmo_repo.upstream import olmo_core as upstream
    from olmo_repo.upstream import source_hash

    assert version("ai2-olmo-core") == upstream.VERSION
    assert {name: source_hash(name) for name in upstream.CANARIES} == upstream.CANARIES
