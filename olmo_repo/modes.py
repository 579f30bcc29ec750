"""The position-mode spec: which layers use which positions. Standard library only.

One rule, read by the OLMo side (`olmo_repo.config`), the Hugging Face side (`olmo_repo.hf`) and converted
checkpoints, which carry this file as remote code beside `rope.py`:

    a layer takes `pe_mode` when its id is >= `pe_start_layer` and, if `pe_layer_ids` is set, in that list;
    every other layer keeps stock RoPE.

The paper's setups:

    RePo 1B (16 layers)   pe_mode: repo, pe_start_layer: 5          -> layers 5..15
    RePo 7B (32 layers)   pe_mode: repo, pe_start_layer: 10         -> layers 10..31
    NoPE                  pe_mode: nope                             -> every layer
    R2N1 (16 layers)      pe_mode: nope, pe_layer_ids: [2, 5, 8, 11, 14]
    N2R1 (16 layers)      pe_mode: nope, pe_layer_ids: [0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15]

The reference implementation spells the same thing two ways, each read by its own reader over this rule:
its OLMo YAML (`dynamic_pe_mode`, `dynamic_pe_start_layer`, `dynamic_pe_layer_ids`; `olmo_repo.config`) and
its HF `pe_config` (`dynamic_pe_mode` with the misspelled `dynmaic_pe_start_layer`/`dynmaic_pe_layer_ids`;
`olmo_repo.hf.configuration_repo_olmo2`). Both name modes with `REFERENCE_MODES` and write layer lists as
"2,5,8" (`parse_layer_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "F_PHI_WEIGHTS",
    "MODES",
    "POSITIONS_METRIC",
    "REFERENCE_MODES",
    "check_position_modes",
    "layer_modes",
    "parse_layer_ids",
    "reference_mode",
    "repo_layers",
    "selected_layers",
]

MODES = ("rope", "nope", "repo")
"""rope: integer positions 0..T-1 (stock); nope: no rotation; repo: real per-head positions from f_phi."""

REFERENCE_MODES = {"none": "rope", "nope": "nope", "swigluex_multihead": "repo"}
"""The reference's `dynamic_pe_mode` values and their modes here (its `cope` is another method)."""

F_PHI_WEIGHTS = ("gate_map", "content_map", "final_map")
"""f_phi's linear maps, in the order `olmo_repo.rope.f_phi` takes them; `{name}.weight` in a RePo layer."""

POSITIONS_METRIC = "train/positions/layer{layer}/{stat}"
"""The training metrics of a RePo layer's predicted positions; stat: min, max, std."""


def selected_layers(n_layers: int, start: int = 0, ids: Sequence[int] | None = None) -> list[int]:
    """The layers that take `pe_mode`: ids >= `start` and, if `ids` is set, in it."""
    return [i for i in range(n_layers) if i >= start and (ids is None or i in ids)]


def layer_modes(mode: str, n_layers: int, start: int = 0, ids: Sequence[int] | None = None) -> list[str]:
    """The position mode of every layer: `mode` for the selected ones, `rope` for the others."""
    selected = set(selected_layers(n_layers, start, ids))
    return [mode if i in selected else "rope" for i in range(n_layers)]


def repo_layers(modes: Sequence[str]) -> list[int]:
    """The ids of the `repo` layers in a list of layer modes."""
    return [i for i, mode in enumerate(modes) if mode == "repo"]


def check_position_modes(
    mode: str,
    start: int,
    ids: Sequence[int] | None,
    sizes: dict[str, int],
    prefix: str = "",
) -> None:
    """Raise one `ValueError` naming the bad key (`prefix` + key) and what it allows.

    sizes: the numbers of layers, heads and key/value heads under the side's own key names, in that order
    (OLMo: n_layers, n_heads, n_kv_heads; HF: num_hidden_layers, ...). The rules that hold on every side;
    each side adds its own (OLMo: the block type; HF: the RoPE type).
    """
    (layers_key, n_layers), (heads_key, n_heads), (kv_key, n_kv) = sizes.items()
    in_range = f"allowed 0..{n_layers - 1} ({layers_key}={n_layers})"
    if mode not in MODES:
        raise ValueError(f"{prefix}pe_mode={mode!r} is not supported; allowed: {', '.join(MODES)}")
    if not 0 <= start < n_layers:
        raise ValueError(f"{prefix}pe_start_layer={start} is out of range: {in_range}")
    if ids is not None:
        if bad := [i for i in ids if not 0 <= i < n_layers]:
            raise ValueError(f"{prefix}pe_layer_ids has layer ids {bad} out of range: {in_range}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{prefix}pe_layer_ids={list(ids)} repeats a layer id")
    if mode == "rope":
        return
    if not selected_layers(n_layers, start, ids):
        raise ValueError(
            f"{prefix}pe_mode={mode} selects no layer: pe_start_layer={start} and "
            f"pe_layer_ids={None if ids is None else list(ids)} have no layer in common"
        )
    if mode == "repo" and n_kv != n_heads:
        raise ValueError(
            f"{prefix}pe_mode=repo predicts one position per query head, so grouped-query attention is not "
            f"supported: {prefix}{kv_key}={n_kv} must equal {prefix}{heads_key}={n_heads}"
        )


def reference_mode(value: str, key: str) -> str:
    """A reference `dynamic_pe_mode` value as a mode here; ValueError naming `key` otherwise."""
    if value not in REFERENCE_MODES:
        raise ValueError(f"{key}={value!r} is not supported; allowed: {', '.join(REFERENCE_MODES)}")
    return REFERENCE_MODES[value]


def parse_layer_ids(value: str | Sequence[int] | None, key: str) -> list[int] | None:
    """The reference's layer list ("2,5,8", or a list) as a list; "" or None selects every layer (None)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [int(i) for i in value.split(",") if i.strip()]
        except ValueError:
            raise ValueError(f"{key}={value!r} is not a comma-separated list of layer ids") from None
    return list(value) or None
