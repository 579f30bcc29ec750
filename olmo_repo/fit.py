"""The stage-1 fit rule: whether a checkpoint fits the model of a config, for both trainers. Standard library only.

The recipe starts RePo (stage 2) from a stage-1 checkpoint: every tensor of the RePo model except f_phi's weights
(`gate_map`, `content_map`, `final_map` of each RePo layer). So a checkpoint fits a model when

- it has every key of the model (a RePo run resumed, or a stock model into a stock config), or
- it lacks the f_phi weights, all of them, and nothing else (stage 1: they keep their fresh init);

and every key it has is a key of the model, with the model's shape. Anything else is refused, every problem
named in one `CheckpointFitError`. f_phi weights in other layers than the config's RePo layers (a RePo run
continued with another `pe_start_layer`) are named by layer: a silently mixed model (fresh f_phi in some layers,
trained in others) is the failure this rule exists for.

Each trainer passes its own state keys (ai2-olmo `transformer.blocks.3.gate_map.weight`, OLMo-core
`blocks.3.attention.gate_map.weight` and that weight's optimizer state) with their shapes; the rule reads the
layer of an f_phi key from its name (`f_phi_layer`) and never imports a framework, so both give the same answer
to the same bad input.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from .errors import RepoError
from .modes import F_PHI_WEIGHTS

__all__ = ["CheckpointFitError", "f_phi_layer", "fit_stage1", "listed"]

_F_PHI_KEY = re.compile(
    rf"(?:^|\.)(?:blocks|layers)\.(\d+)\.(?:[a-z_]+\.)?(?:{'|'.join(F_PHI_WEIGHTS)})\.weight(?:\.|$)"
)

HINT = "Compare the model's sizes and pe_mode, pe_start_layer, pe_layer_ids with the checkpoint's config."


class CheckpointFitError(RepoError):
    """A checkpoint that does not fit the model of the run's config."""


def f_phi_layer(key: str) -> int | None:
    """The layer of an f_phi weight's state key (its optimizer state's too); None for any other key."""
    match = _F_PHI_KEY.search(key)
    return int(match.group(1)) if match else None


def listed(keys: Collection[str], limit: int = 6) -> str:
    """`keys` sorted, comma-separated, the first `limit` of them and how many more."""
    names = sorted(keys)
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _layers(keys: Collection[str]) -> str:
    layers = sorted({layer for key in keys if (layer := f_phi_layer(key)) is not None})
    return ", ".join(map(str, layers)) if layers else "none"


def fit_stage1(
    model: Mapping[str, Sequence[int]], checkpoint: Mapping[str, Sequence[int]], source: str
) -> set[str]:
    """Check the keys and shapes of a checkpoint against the model's ({state key: shape}, in one naming).

    Returns the model keys the checkpoint lacks: none (a complete checkpoint) or every f_phi key (a stage-1
    checkpoint). Otherwise raises `CheckpointFitError`, "`source` does not fit the model of this config: ..."
    with every problem: f_phi in other layers than the config's, missing keys, unknown keys, other shapes.
    """
    f_model = {k for k in model if f_phi_layer(k) is not None}
    f_stored = {k for k in checkpoint if f_phi_layer(k) is not None}
    problems = []
    elsewhere = bool(f_stored) and _layers(f_stored) != _layers(f_model)
    if elsewhere:
        problems.append(
            f"it has f_phi weights in layers {_layers(f_stored)} but the config's RePo layers are "
            f"{_layers(f_model)} (a stage-1 checkpoint has none, a RePo checkpoint those of its config)"
        )
    elif f_stored and (lacking := f_model - f_stored):
        problems.append(f"it lacks the f_phi weights {listed(lacking)} of its RePo layers")
    if missing := set(model) - set(checkpoint) - f_model:
        problems.append(
            f"it lacks {len(missing)} keys of the model that are not f_phi weights: {listed(missing)}"
        )
    if unknown := set(checkpoint) - set(model) - (f_stored if elsewhere else set()):
        problems.append(f"it has {len(unknown)} keys the model does not: {listed(unknown)}")
    if shapes := {
        f"{k} {tuple(checkpoint[k])} (model {tuple(model[k])})"
        for k in set(checkpoint) & set(model)
        if tuple(checkpoint[k]) != tuple(model[k])
    }:
        problems.append(f"{len(shapes)} keys have other shapes: {listed(shapes, 3)}")
    if problems:
        raise CheckpointFitError(
            f"{source} does not fit the model of this config: {'; '.join(problems)}. {HINT}"
        )
    return f_model - f_stored
