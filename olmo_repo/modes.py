"""The position-mode spec: which layers use which positions. Standard library only.

One rule, read by every backend (the OLMo side, Hugging Face, vLLM, OLMo-core) and shipped in converted
checkpoints as remote code beside `rope.py` and `rotation.py`:

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

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from enum import Enum
from typing import Any

__all__ = [
    "F_PHI_HIDDEN_RATIO",
    "F_PHI_WEIGHTS",
    "INDEX_BLEND_METRIC",
    "PE_KEYS",
    "POSITIONS_METRIC",
    "POSITION_STATS",
    "REFERENCE_BLEND_KEYS",
    "REFERENCE_MODES",
    "SCORED_PE_KEYS",
    "FPhiTraining",
    "PositionKeys",
    "PositionMode",
    "PositionSource",
    "ScoredPositionKeys",
    "check_index_blend",
    "check_pe_keys",
    "check_position_modes",
    "check_scored_positions",
    "index_blend",
    "is_f_phi_param",
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


class PositionSource(str, Enum):
    """What a RePo layer rotates q and k by (`pe_positions`): an evaluation-time ablation of the learned
    positions."""

    learned = "learned"
    """f_phi's positions (blended with the token index by `pe_blend`): the model as trained."""
    index = "index"
    """The token index: the layer scores as the RoPE layer it replaced (f_phi unused)."""
    constant = "constant"
    """One position for every token: no rotation, the layer scores as NoPE (f_phi unused)."""

    def __str__(self) -> str:
        return self.value


@dataclass(kw_only=True)
class PositionKeys:
    """The position keys of every model config of this project, declared once: the model configs of both
    trainers (`RepoModelConfig`, OLMo-core's `RepoAttentionConfig`) and the four HF configs inherit them.

    Which layers: a layer takes `pe_mode` when its id is >= `pe_start_layer` and, if `pe_layer_ids` is set,
    in that list (`layer_modes`). The index blend (a warm start the reference's code holds and its paper runs
    left off): a RePo layer rotates by

        z' = (1 - p) z + p i        z: f_phi's positions, i: the token's index (absolute, under a KV cache)

    with p falling linearly from `pe_blend_init` to 0 over `pe_blend_steps` optimizer steps (`index_blend`). At
    p = 1 the layer is the RoPE layer it replaced, so inserting RePo costs nothing, and the positions hand over
    to f_phi as p falls. The trainers set p every step; a checkpoint converted to HF records the p of its step
    (`ScoredPositionKeys.pe_blend`).
    """

    pe_mode: str = "rope"
    """Position mode of the selected layers: rope (integer positions, stock), nope (no rotation) or repo (real
    positions predicted by f_phi). Unselected layers use rope."""
    pe_start_layer: int = 0
    """First selected layer, 0-indexed (the paper: 5 for the 16-layer 1B, 10 for the 32-layer 7B)."""
    pe_layer_ids: list[int] | None = None
    """If set, only these layers (those also >= pe_start_layer) are selected; null selects all of them."""
    pe_blend_init: float = 0.0
    """p of the index blend at step 0, in [0, 1] (1: RePo layers start as RoPE). The paper: 0."""
    pe_blend_steps: int = 0
    """Optimizer steps over which p falls linearly to 0; 0: no blend (p = 0, the reference's rule)."""


PE_KEYS = tuple(f.name for f in dataclasses.fields(PositionKeys))
"""The position keys of the model configs, as every config of this project spells them."""

REFERENCE_BLEND_KEYS = {
    "dynamic_pe_init_pdrop": "pe_blend_init",
    "dynamic_pe_dropout_anneal_step": "pe_blend_steps",
}
"""The reference's names of the blend schedule (its HF `pe_config`, its OLMo model config) and the keys here."""


@dataclass(kw_only=True)
class ScoredPositionKeys(PositionKeys):
    """`PositionKeys` plus what an inference config (the four HF configs, read by vLLM too) scores with."""

    pe_blend: float = 0.0
    """p of the index blend that RePo layers score with, in [0, 1]: a checkpoint converted at step s of its
    run records the schedule's p at s (`index_blend`), so it scores as training did. 0: f_phi's positions."""
    pe_positions: str = "learned"
    """learned (f_phi's, blended by pe_blend), index (the token index: RoPE) or constant (no rotation: NoPE):
    replaces the positions of RePo layers at evaluation, an ablation of what they learned."""


SCORED_PE_KEYS = tuple(f.name for f in dataclasses.fields(ScoredPositionKeys))
"""`PE_KEYS` and the keys an inference config adds."""


def index_blend(init: float, steps: int, step: int) -> float:
    """p of the index blend after `step` optimizer steps: `init` falling linearly to 0 at `steps`, 0 from
    then on; 0 when `steps` is 0 (no blend, the reference's rule)."""
    if steps <= 0 or step >= steps:
        return 0.0
    return init * (1.0 - step / steps)


def check_index_blend(
    init: float, steps: int, *, has_repo: bool, prefix: str = "", training: bool = False
) -> None:
    """One `ValueError` naming the bad key (`prefix` + key): p0 outside [0, 1], a negative or fractional anneal,
    a blend on a model without RePo layers (nothing to blend), or, in a training config (`training`), a p0 with
    no anneal, which the schedule would ignore (the reference's rule; a model's config may record it)."""
    if isinstance(init, bool) or not isinstance(init, (int, float)) or not 0.0 <= init <= 1.0:
        raise ValueError(f"{prefix}pe_blend_init={init!r} is not a blend weight; allowed: a number in [0, 1]")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(
            f"{prefix}pe_blend_steps={steps!r} is not a step count; allowed: a whole number >= 0 (0: no blend)"
        )
    if training and init > 0 and steps == 0:
        raise ValueError(
            f"{prefix}pe_blend_init={init} with {prefix}pe_blend_steps=0 is no blend (p is 0 from step 0): set "
            f"{prefix}pe_blend_steps to the steps over which p falls to 0, or {prefix}pe_blend_init=0"
        )
    if not has_repo and init > 0 and steps > 0:
        raise ValueError(
            f"{prefix}pe_blend_init={init} blends the positions of RePo layers, but this model has none "
            f"(set {prefix}pe_mode=repo, or pe_blend_init=0)"
        )


def check_scored_positions(blend: float, source: str, *, has_repo: bool, prefix: str = "") -> None:
    """One `ValueError` naming the bad key of `ScoredPositionKeys`: `pe_blend` outside [0, 1], an unknown
    `pe_positions`, or either set on a model without RePo layers."""
    if isinstance(blend, bool) or not isinstance(blend, (int, float)) or not 0.0 <= blend <= 1.0:
        raise ValueError(f"{prefix}pe_blend={blend!r} is not a blend weight; allowed: a number in [0, 1]")
    if str(source) not in PositionSource.__members__:
        raise ValueError(
            f"{prefix}pe_positions={source!r} is not supported; allowed: {', '.join(PositionSource.__members__)}"
        )
    if not has_repo and (blend > 0 or str(source) != PositionSource.learned):
        key, value = ("pe_blend", blend) if blend > 0 else ("pe_positions", source)
        raise ValueError(
            f"{prefix}{key}={value} acts on the positions of RePo layers, but this model has none (pe_mode="
            "repo selects them)"
        )


@dataclass(kw_only=True)
class FPhiTraining:
    """How the trainers optimise f_phi (`f_phi.*` in both trainers' run configs): its own learning rate and
    weight decay, or f_phi alone. Adam moves a weight by about lr per step, so at the paper's lr a run of a few
    hundred steps leaves f_phi at its init; a multiplier lets positions travel at the scale one machine affords.
    """

    lr_multiplier: float = 1.0
    """f_phi's learning rate is the schedule's times this (warm-up and decay keep their shape). The paper: 1."""
    weight_decay: float | None = None
    """f_phi's weight decay; null: the base's (the paper's: OLMo's weight decay on every linear weight)."""
    only: bool = False
    """Train f_phi alone, every other weight frozen: whether positions can be learned at all."""

    def check(self, *, has_repo: bool, prefix: str = "f_phi.") -> None:
        """One `ValueError` naming the bad key (`prefix` + key)."""
        m = self.lr_multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
            raise ValueError(
                f"{prefix}lr_multiplier={m!r}; allowed: a finite number > 0 (1: the schedule's lr)"
            )
        wd = self.weight_decay
        if wd is not None and (
            isinstance(wd, bool) or not isinstance(wd, (int, float)) or not math.isfinite(wd) or wd < 0
        ):
            raise ValueError(
                f"{prefix}weight_decay={wd!r}; allowed: a finite number >= 0, or null (the base's)"
            )
        if self.only and not has_repo:
            raise ValueError(
                f"{prefix}only=true trains f_phi alone, but this model has no RePo layer (no f_phi): set "
                "pe_mode=repo, or only=false"
            )

    def resume_problem(self, saved: FPhiTraining, checkpoint: str) -> str | None:
        """The one line refusing a resume with these values from a `checkpoint` trained with `saved` (its
        optimizer groups and frozen weights are of those), or None where they agree: both trainers' words."""
        for f in dataclasses.fields(self):
            new, old = getattr(self, f.name), getattr(saved, f.name)
            if new != old:
                key = f"f_phi.{f.name}"
                return (
                    f"{key}={_override(new)}, but {checkpoint} was trained with {key}={_override(old)}: resume "
                    f"with --{key}={_override(old)}, or train the new value in a new save folder"
                )
        return None


def _override(value: Any) -> str:
    """A value as a `--key=value` override writes it (null, true, 10.0)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def is_f_phi_param(name: str) -> bool:
    """Whether a parameter name (`....gate_map.weight`, wrapped or not) is one of f_phi's weights."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in F_PHI_WEIGHTS


POSITION_STATS = ("min", "max", "std", "p05", "p95", "rank_corr")
"""What is logged of a RePo layer's positions z [B, H_kv, T] (first micro-batch of a step): extremes, spread
(std, 5th and 95th percentile), and Spearman's rank correlation with the token index, averaged over (sequence,
head) rows (1: ordered as the tokens, as RoPE; 0: unrelated)."""

POSITIONS_METRIC = "train/positions/layer{layer}/{stat}"
"""The training metrics of a RePo layer's predicted positions; stat: one of `POSITION_STATS`."""

INDEX_BLEND_METRIC = "train/positions/index_blend"
"""The p of the index blend the step trained with (logged while a blend is on)."""


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
    (`pe_mdoe`, `pe_start`, `pemode`), naming the nearest of `SCORED_PE_KEYS`: a misspelt key would otherwise leave
    the layers at their default, RoPE, in silence. Other keys (the stock ones of a config) and `allowed` pass."""
    known = {*SCORED_PE_KEYS, *allowed}
    for key in keys:
        if key in known:
            continue
        prefixed = key.startswith("pe_")  # surely meant as one; else only a near spelling counts
        near = get_close_matches(key, SCORED_PE_KEYS, n=1, cutoff=0.5 if prefixed else 0.8)
        if prefixed or near:
            hint = (
                f"did you mean {near[0]!r}?" if near else f"the position keys are {', '.join(SCORED_PE_KEYS)}"
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
