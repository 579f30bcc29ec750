"""Configuration: OLMo's config dataclasses plus one position mode per layer.

A layer uses `pe_mode` when it is selected, and stock RoPE otherwise. A layer is selected when its id is
>= `pe_start_layer` and, if `pe_layer_ids` is set, in that list. The paper's setups:

    RePo 1B (16 layers)   pe_mode: repo, pe_start_layer: 5          -> layers 5..15
    RePo 7B (32 layers)   pe_mode: repo, pe_start_layer: 10         -> layers 10..31
    NoPE                  pe_mode: nope                             -> every layer
    R2N1 (16 layers)      pe_mode: nope, pe_layer_ids: [2, 5, 8, 11, 14]
    N2R1 (16 layers)      pe_mode: nope, pe_layer_ids: [0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15]

The reference fork's keys (`model.dynamic_pe_mode`, `model.dynamic_pe_start_layer`,
`model.dynamic_pe_layer_ids`, top-level `data_prefix`) load too and mean the same thing. As in the reference
fork, `data_prefix` is a local copy of http://olmo-data.org: the official configs name their data by URL, and
with `data_prefix` set those files are read from the copy instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from olmo.aliases import PathOrStr
from olmo.config import BlockType, DataConfig, ModelConfig, TrainConfig
from olmo.exceptions import OLMoConfigurationError
from olmo.util import StrEnum
from omegaconf import DictConfig
from omegaconf import OmegaConf as om

__all__ = ["PositionMode", "RepoModelConfig", "RepoTrainConfig", "layer_modes", "repo_layer_ids"]

OLMO_DATA_URL = "http://olmo-data.org"
"""Where the released OLMo-2 configs (and so the official ones here) read their data from."""


class PositionMode(StrEnum):
    rope = "rope"
    """Integer positions 0..T-1: stock OLMo RoPE."""
    nope = "nope"
    """No rotation: every token has the same position."""
    repo = "repo"
    """Real per-head positions predicted from the hidden state by f_phi (RePo)."""


# The reference fork's `dynamic_pe_mode` values. `cope` is a different method and is not supported.
_REFERENCE_MODES = {
    "none": PositionMode.rope,
    "nope": PositionMode.nope,
    "swigluex_multihead": PositionMode.repo,
}


@dataclass
class RepoModelConfig(ModelConfig):
    """OLMo's `ModelConfig` plus the RePo keys (`pe_*`). Validated on construction."""

    pe_mode: PositionMode = PositionMode.rope
    """Position mode of the selected layers: rope, nope or repo. Unselected layers use rope."""

    pe_start_layer: int = 0
    """First selected layer, 0-indexed (the paper: 5 for the 16-layer 1B, 10 for the 32-layer 7B)."""

    pe_layer_ids: list[int] | None = None
    """If set, only these layers (those also >= pe_start_layer) are selected; null selects all of them."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise one `OLMoConfigurationError` naming the bad key and what it allows."""
        n = self.n_layers
        if not 0 <= self.pe_start_layer < n:
            raise OLMoConfigurationError(
                f"model.pe_start_layer={self.pe_start_layer} is out of range: allowed 0..{n - 1} (n_layers={n})"
            )
        if self.pe_layer_ids is not None:
            bad = [i for i in self.pe_layer_ids if not 0 <= i < n]
            if bad:
                raise OLMoConfigurationError(
                    f"model.pe_layer_ids has layer ids {bad} out of range: allowed 0..{n - 1} (n_layers={n})"
                )
            if len(set(self.pe_layer_ids)) != len(self.pe_layer_ids):
                raise OLMoConfigurationError(f"model.pe_layer_ids={self.pe_layer_ids} repeats a layer id")
        if self.pe_mode == PositionMode.rope:
            return
        if not _selected_layers(self):
            raise OLMoConfigurationError(
                f"model.pe_mode={self.pe_mode} selects no layer: pe_start_layer={self.pe_start_layer} and "
                f"pe_layer_ids={self.pe_layer_ids} have no layer in common"
            )
        if not self.rope:
            raise OLMoConfigurationError(
                f"model.pe_mode={self.pe_mode} needs model.rope=true (the other layers use RoPE and the "
                "RePo/NoPE layers take rope_theta from it); allowed: rope: true"
            )
        if self.block_type != BlockType.sequential:
            raise OLMoConfigurationError(
                f"model.pe_mode={self.pe_mode} needs model.block_type=sequential (got {self.block_type}); "
                "allowed: sequential"
            )
        if self.pe_mode == PositionMode.repo and self.effective_n_kv_heads != self.n_heads:
            raise OLMoConfigurationError(
                f"model.pe_mode=repo predicts one position per query head, so grouped-query attention is not "
                f"supported: model.n_kv_heads={self.n_kv_heads} must be null or equal n_heads={self.n_heads}"
            )

    @classmethod
    def update_legacy_settings(cls, config: Any) -> Any:
        return _translate_reference_keys(config, prefix="model.")


def _selected_layers(config: ModelConfig) -> list[int]:
    ids = getattr(config, "pe_layer_ids", None)
    start = getattr(config, "pe_start_layer", 0)
    return [i for i in range(config.n_layers) if i >= start and (ids is None or i in ids)]


def layer_modes(config: ModelConfig) -> list[PositionMode]:
    """The position mode of every layer. A stock `ModelConfig` gives all `rope`."""
    mode = PositionMode(getattr(config, "pe_mode", PositionMode.rope))
    selected = set(_selected_layers(config))
    return [mode if i in selected else PositionMode.rope for i in range(config.n_layers)]


def repo_layer_ids(config: ModelConfig) -> list[int]:
    """The layers that use RePo positions."""
    return [i for i, mode in enumerate(layer_modes(config)) if mode == PositionMode.repo]


@dataclass
class RepoTrainConfig(TrainConfig):
    """OLMo's `TrainConfig` with a `RepoModelConfig` and the reference fork's `data_prefix`."""

    model: RepoModelConfig = field(default_factory=RepoModelConfig)
    """The model, with the RePo keys."""

    data_prefix: str | None = None
    """A local copy of http://olmo-data.org: `${data_prefix}` in data paths (the reference configs), and
    where data paths under that URL (the official configs) are read from when set."""

    @classmethod
    def load(
        cls,
        path: PathOrStr,
        overrides: list[str] | None = None,
        key: str | None = None,
        validate_paths: bool = True,
    ) -> RepoTrainConfig:
        """OLMo's `load`; then, with `data_prefix` set, data paths under `OLMO_DATA_URL` point into it."""
        config = super().load(path, overrides, key, validate_paths)
        if config.data_prefix is not None:
            prefix = config.data_prefix.rstrip("/")
            for data in [config.data] + [e.data for e in config.evaluators]:
                _read_olmo_data_from(data, prefix)
        return config

    @classmethod
    def update_legacy_settings(cls, config: Any) -> Any:
        config = super().update_legacy_settings(config)
        if om.is_dict(config) and "model" in config:
            config.model = _translate_reference_keys(config.model, prefix="model.")
        return config


def _read_olmo_data_from(data: DataConfig, prefix: str) -> None:
    def local(path: str) -> str:
        return prefix + path[len(OLMO_DATA_URL) :] if path.startswith(OLMO_DATA_URL + "/") else path

    if data.paths:
        data.paths = [local(p) for p in data.paths]
    if data.datasets:
        data.datasets = {label: [local(p) for p in paths] for label, paths in data.datasets.items()}
    if data.label_mask_paths:
        data.label_mask_paths = [local(p) for p in data.label_mask_paths]


def _translate_reference_keys(model: Any, prefix: str) -> Any:
    """Map the reference fork's `dynamic_pe_*` keys onto `pe_*`, refusing to mix the two spellings."""
    if not isinstance(model, DictConfig):
        return model
    old = [k for k in ("dynamic_pe_mode", "dynamic_pe_start_layer", "dynamic_pe_layer_ids") if k in model]
    if not old:
        return model
    mixed = [k for k in ("pe_mode", "pe_start_layer", "pe_layer_ids") if k in model]
    if mixed:
        raise OLMoConfigurationError(
            f"{prefix}{old[0]} and {prefix}{mixed[0]} are both set: use the pe_* keys or the reference "
            "fork's dynamic_pe_* keys, not both"
        )
    model = model.copy()
    if "dynamic_pe_mode" in model:
        value = str(model.pop("dynamic_pe_mode"))
        if value not in _REFERENCE_MODES:
            raise OLMoConfigurationError(
                f"{prefix}dynamic_pe_mode={value!r} is not supported; allowed: {', '.join(_REFERENCE_MODES)}"
            )
        model.pe_mode = str(_REFERENCE_MODES[value])
    if "dynamic_pe_start_layer" in model:
        model.pe_start_layer = model.pop("dynamic_pe_start_layer")
    if "dynamic_pe_layer_ids" in model:
        ids = model.pop("dynamic_pe_layer_ids")
        if isinstance(ids, str):  # the reference writes "2,5,8"; "" means all layers
            try:
                ids = [int(i) for i in ids.split(",") if i.strip()] or None
            except ValueError:
                raise OLMoConfigurationError(
                    f"{prefix}dynamic_pe_layer_ids={ids!r} is not a comma-separated list of layer ids"
                ) from None
        model.pe_layer_ids = ids
    return model
