"""Bad and good stage-1 inputs for both trainers: one table, run by tests/test_stage1_init.py (ai2-olmo, .venv)
and tests/core/test_stage1.py (OLMo-core, .venv-core), each building the checkpoint and the config in its own
framework from the same description. Both must give the text of `expected` (`olmo_repo.fit`'s message; keys in
the trainer's own naming through `key`). Standard library only: imported in both environments.

Every model is the trainers' tiny OLMo-2 shape with 4 layers; a case names the checkpoint's model and the
config's model by their keyword changes, and what is removed from the checkpoint (an f_phi weight by layer).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from olmo_repo.fit import HINT


@dataclass(frozen=True)
class Case:
    name: str
    checkpoint: dict  # the checkpoint's model: pe_mode, pe_start_layer, n_layers
    config: dict  # the run config's model
    drop: tuple[int, str] | None = None  # (layer, f_phi weight) removed from the checkpoint
    new_layers: tuple[int, ...] | None = None  # accepted: the RePo layers whose f_phi keeps its init
    expected: str = ""  # refused: a regex of the message after "... does not fit the model of this config: "
    keys: dict = field(default_factory=dict)  # {placeholder: (layer, weight)}: keys named in `expected`


CASES = [
    Case("stage1", dict(pe_mode="rope"), dict(pe_mode="repo", pe_start_layer=1), new_layers=(1, 2, 3)),
    Case(
        "resume",
        dict(pe_mode="repo", pe_start_layer=1),
        dict(pe_mode="repo", pe_start_layer=1),
        new_layers=(),
    ),
    Case("stock", dict(pe_mode="rope"), dict(pe_mode="rope"), new_layers=()),
    Case(
        "repo-layers-below",
        dict(pe_mode="repo", pe_start_layer=2),
        dict(pe_mode="repo", pe_start_layer=1),
        expected=r"it has f_phi weights in layers 2, 3 but the config's RePo layers are 1, 2, 3 \(a stage-1 "
        r"checkpoint has none, a RePo checkpoint those of its config\)\. ",
    ),
    Case(
        "repo-layers-above",
        dict(pe_mode="repo", pe_start_layer=1),
        dict(pe_mode="repo", pe_start_layer=3),
        expected=r"it has f_phi weights in layers 1, 2, 3 but the config's RePo layers are 3 \(",
    ),
    Case(
        "repo-into-rope",
        dict(pe_mode="repo", pe_start_layer=2),
        dict(pe_mode="rope"),
        expected=r"it has f_phi weights in layers 2, 3 but the config's RePo layers are none \(",
    ),
    Case(
        "one-f_phi-weight-missing",
        dict(pe_mode="repo", pe_start_layer=1),
        dict(pe_mode="repo", pe_start_layer=1),
        drop=(2, "gate_map"),
        expected=r"it lacks the f_phi weights {gate} of its RePo layers\. ",
        keys={"gate": (2, "gate_map")},
    ),
    Case(
        "a-layer-more",
        dict(pe_mode="repo", pe_start_layer=1, n_layers=5),
        dict(pe_mode="repo", pe_start_layer=1),
        expected=r"it has f_phi weights in layers 1, 2, 3, 4 but the config's RePo layers are 1, 2, 3 \(.*\); "
        r"it has \d+ keys the model does not: .*blocks\.4\.",
    ),
    Case(
        "a-layer-less",
        dict(pe_mode="rope", n_layers=3),
        dict(pe_mode="repo", pe_start_layer=1),
        expected=r"it lacks \d+ keys of the model that are not f_phi weights: .*blocks\.3\.",
    ),
    Case(
        "wider",
        dict(pe_mode="rope", d_model=128),
        dict(pe_mode="repo", pe_start_layer=1),
        expected=r"\d+ keys have other shapes: .*\(model \(",
    ),
]


def message(case: Case, key: Callable[[int, str], str]) -> str:
    """The regex the refusal of `case` must match from its start, keys named by `key(layer, weight)`."""
    expected = case.expected.format(**{name: re.escape(key(*where)) for name, where in case.keys.items()})
    return rf".* does not fit the model of this config: {expected}.*{re.escape(HINT)}$"
