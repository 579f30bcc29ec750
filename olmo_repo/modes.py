"""The position-mode spec: which layers use which positions. Standard library only.

One rule, read by every backend (the OLMo side, Hugging Face, vLLM, OLMo-core) and shipped in converted
checkpoints as remote code beside `rope.py`:

    a layer takes `pe_mode` when its id is >= `pe_start_layer` and, if `pe_layer_ids` is set, in that list;
    every other layer keeps stock RoPE.

The paper's setups:

    RePo 1B (16 layers)   pe_mode: repo, pe_start_layer: 5          -> layers 5..15
    RePo 7B (32 layers)   pe_mode: repo, pe_start_layer: 10         -> layers 10..31
    NoPE                  pe_mode: nope                             -> every layer
    R2N1 (16 layers)      pe_mode: nope, pe_layer_ids: [2, 5, 8, 11, 14]
    N2R1 (16 layers)      pe_mode: nope, pe_layer_ids: [0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15]

The reference implementation spells the same thing two ways: its OLMo YAML (`dynamic_pe_mode`,
`dynamic_pe_start_layer`, `dynamic_pe_layer_ids`; read by `olmo_repo.ai2olmo.config`) and its HF `pe_config`
(`dynamic_pe_mode` with the misspelled `dynmaic_pe_start_layer`/`dynmaic_pe_layer_ids`; read by
`olmo_repo.hf.reference`). Both name modes as `REFERENCE_MODES` does and write layer lists as "2,5,8"
(`parse_layer_ids`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from difflib import get_close_matches
from enum import Enum
from typing import Any

__all__ = [
    "F_PHI_HIDDEN_RATIO",
    "F_PHI_WEIGHTS",
    "PE_KEYS",
    "POSITIONS_METRIC",
    "REFERENCE_MODES",
    "PositionMode",
    "check_pe_keys",
    "check_position_modes",
    "layer_modes",
    "parse_layer_ids",
    "reference_mode",
    "repo_layer_ids",
]


class PositionMode(str, Enum):
    """The position mode of a layer. A `str`: `mode == "repo"` holds, and configs store the plain name."""

    rope = "rope"
    """Integer positions 0..T-1 (stock)."""
    nope = "nope"
    """No rotation."""
    repo = "repo"
    """Real positions from f_phi: one per key/value head and token (its query heads share it)."""

    def __str__(self) -> str:
        return self.value


REFERENCE_MODES = {
    "none": PositionMode.rope,
    "nope": PositionMode.nope,
    "swigluex_multihead": PositionMode.repo,
}
"""The reference's `dynamic_pe_mode` values and their modes here (its `cope` is another method)."""

F_PHI_WEIGHTS = ("gate_map", "content_map", "final_map")
"""f_phi's linear maps, in the order `olmo_repo.rope.f_phi` takes them; `{name}.weight` in a RePo layer."""

F_PHI_HIDDEN_RATIO = 8
"""f_phi's hidden width is d_model // 8 (gate_map, content_map: d_model -> d_model // 8; the paper's)."""

PE_KEYS = ("pe_mode", "pe_start_layer", "pe_layer_ids")
"""The position-mode keys, as every config of this project spells them."""

POSITIONS_METRIC = "train/positions/layer{layer}/{stat}"
"""The training metrics of a RePo layer's predicted positions; stat: min, max, std."""


def _layer_count(config: Any, n_layers: int | None) -> int:
    if n_layers is not None:
        return n_layers
    for key in ("n_layers", "num_hidden_layers"):
        if isinstance(value := getattr(config, key, None), int):
            return value
    raise TypeError(f"{type(config).__name__} has neither n_layers nor num_hidden_layers: pass n_layers")


def layer_modes(config: Any, n_layers: int | None = None) -> list[PositionMode]:
    """The position mode of every layer of a config of any backend.

    Reads `pe_mode`, `pe_start_layer` and `pe_layer_ids` (a stock config has none: every layer `rope`) and
    the layer count from `n_layers` (OLMo), `num_hidden_layers` (Hugging Face) or the argument.
    """
    mode = PositionMode(str(getattr(config, "pe_mode", "rope")))
    start, ids = getattr(config, "pe_start_layer", 0), getattr(config, "pe_layer_ids", None)
    return [
        mode if i >= start and (ids is None or i in ids) else PositionMode.rope
        for i in range(_layer_count(config, n_layers))
    ]


def repo_layer_ids(config: Any, n_layers: int | None = None) -> list[int]:
    """The ids of the layers of `config` that predict positions (`repo`)."""
    return [i for i, mode in enumerate(layer_modes(config, n_layers)) if mode == PositionMode.repo]


def check_position_modes(
    pe_mode: str,
    pe_start_layer: int,
    pe_layer_ids: Sequence[int] | None,
    *,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    keys: Mapping[str, str] | None = None,
    prefix: str = "",
) -> None:
    """Raise one `ValueError` naming the bad key (`prefix` + key) and what it allows.

    Grouped-query attention (n_kv_heads < n_heads) takes RePo too: one position per key/value head, shared by
    its query heads. These are the rules of every backend; each adds its own (OLMo: the block type; HF: the
    RoPE type). `keys` renames the size keys in messages to the backend's own (HF: {"n_layers":
    "num_hidden_layers", ...}).
    """
    name = {"n_layers": "n_layers", "n_heads": "n_heads", "n_kv_heads": "n_kv_heads", **(keys or {})}
    in_range = f"allowed 0..{n_layers - 1} ({name['n_layers']}={n_layers})"
    if pe_mode not in PositionMode.__members__:
        raise ValueError(
            f"{prefix}pe_mode={pe_mode!r} is not supported; allowed: {', '.join(PositionMode.__members__)}"
        )
    if not 0 <= pe_start_layer < n_layers:
        raise ValueError(f"{prefix}pe_start_layer={pe_start_layer} is out of range: {in_range}")
    if pe_layer_ids is not None:
        if bad := [i for i in pe_layer_ids if not 0 <= i < n_layers]:
            raise ValueError(f"{prefix}pe_layer_ids has layer ids {bad} out of range: {in_range}")
        if len(set(pe_layer_ids)) != len(pe_layer_ids):
            raise ValueError(f"{prefix}pe_layer_ids={list(pe_layer_ids)} repeats a layer id")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(
            f"{prefix}{name['n_kv_heads']}={n_kv_heads} does not divide {prefix}{name['n_heads']}={n_heads}: "
            "grouped-query attention needs the same number of query heads per key/value head; allowed: a "
            f"divisor of {n_heads}"
        )
    if pe_mode == PositionMode.rope:
        return
    if not any(i >= pe_start_layer for i in (range(n_layers) if pe_layer_ids is None else pe_layer_ids)):
        raise ValueError(
            f"{prefix}pe_mode={pe_mode} selects no layer: pe_start_layer={pe_start_layer} and "
            f"pe_layer_ids={None if pe_layer_ids is None else list(pe_layer_ids)} have no layer in common"
        )


def check_pe_keys(keys: Iterable[str], where: str, allowed: Iterable[str] = ()) -> None:
    """Raise one `ValueError` for the first key of `keys` that looks like a position-mode key but is none
    (`pe_mdoe`, `pe_start`, `pemode`), naming the nearest of `PE_KEYS`: a misspelt key would otherwise leave
    the layers at their default, RoPE, in silence. Other keys (the stock ones of a config) and `allowed` pass."""
    known = {*PE_KEYS, *allowed}
    for key in keys:
        if key in known:
            continue
        prefixed = key.startswith("pe_")  # surely meant as one; else only a near spelling counts
        near = get_close_matches(key, PE_KEYS, n=1, cutoff=0.5 if prefixed else 0.8)
        if prefixed or near:
            hint = (
                f"did you mean {near[0]!r}?" if near else f"the position-mode keys are {', '.join(PE_KEYS)}"
            )
            raise ValueError(f"{where}: unknown key {key!r}; {hint}")


def reference_mode(value: str, key: str) -> PositionMode:
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
