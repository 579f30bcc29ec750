"""Configuration: OLMo's config dataclasses plus one position mode per layer.

`RepoModelConfig` adds the keys `pe_mode`, `pe_start_layer`, `pe_layer_ids`; which layers they select, and the
rules they must follow, are `olmo_repo.modes` (shared with the HF side). The reference fork's keys
(`model.dynamic_pe_mode`, `model.dynamic_pe_start_layer`, `model.dynamic_pe_layer_ids`, top-level
`data_prefix`) load too and mean the same thing. As in the reference fork, `data_prefix` is a local copy of
http://olmo-data.org: the official configs name their data by URL, and with `data_prefix` set those files
are read from the copy instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo.aliases import PathOrStr
from olmo.config import BlockType, DataConfig, EvaluatorConfig, ModelConfig, TrainConfig
from olmo.exceptions import OLMoConfigurationError
from omegaconf import DictConfig
from omegaconf import OmegaConf as om
from omegaconf.errors import ConfigKeyError

from .. import datafolder, modes
from ..errors import not_a_key
from ..modes import PositionMode, layer_modes, repo_layer_ids

__all__ = [
    "PositionMode",
    "RepoEvaluatorConfig",
    "RepoModelConfig",
    "RepoTrainConfig",
    "layer_modes",
    "olmo2_model_config",
    "repo_layer_ids",
]

OLMO_DATA_URL = "http://olmo-data.org"
"""Where the released OLMo-2 configs (and so the official ones here) read their data from."""


@dataclass
class RepoModelConfig(ModelConfig):
    """OLMo's `ModelConfig` plus the RePo keys (`pe_*`). Validated on construction."""

    pe_mode: PositionMode = PositionMode.rope
    """Position mode of the selected layers: rope, nope or repo (an Enum: OmegaConf checks it at load).
    Unselected layers use rope."""

    pe_start_layer: int = 0
    """First selected layer, 0-indexed (the paper: 5 for the 16-layer 1B, 10 for the 32-layer 7B)."""

    pe_layer_ids: list[int] | None = None
    """If set, only these layers (those also >= pe_start_layer) are selected; null selects all of them."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise one `OLMoConfigurationError` naming the bad key and what it allows."""
        try:
            modes.check_position_modes(
                str(self.pe_mode),
                self.pe_start_layer,
                self.pe_layer_ids,
                n_layers=self.n_layers,
                n_heads=self.n_heads,
                n_kv_heads=self.effective_n_kv_heads,
                prefix="model.",
            )
        except ValueError as e:
            raise OLMoConfigurationError(str(e)) from None
        if self.pe_mode == PositionMode.rope:
            return
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

    @classmethod
    def update_legacy_settings(cls, config: Any) -> Any:
        return _translate_reference_keys(config, prefix="model.")


def olmo2_model_config(**overrides: Any) -> RepoModelConfig:
    """An OLMo-2-shaped model; sizes (and anything else, the fixed choices included) from `overrides`.

    Fixed: post-norm (`norm_after`), RMS norms with eps 1e-6 and no bias, q/k norms (`attention_layer_norm`),
    no biases in the linear layers, SwiGLU, RoPE with theta 500000, untied input/output embeddings, no
    dropout, and normal init with std 0.02 cut off at 3 std.
    """
    kwargs: dict[str, Any] = dict(
        norm_after=True,
        layer_norm_type="rms",
        layer_norm_eps=1e-6,
        bias_for_layer_norm=False,
        attention_layer_norm=True,
        include_bias=False,
        activation_type="swiglu",
        rope=True,
        rope_theta=500_000,
        weight_tying=False,
        attention_dropout=0.0,
        residual_dropout=0.0,
        embedding_dropout=0.0,
        init_fn="normal",
        init_std=0.02,
        init_cutoff_factor=3,
    )
    return RepoModelConfig(**{**kwargs, **overrides})


@dataclass
class RepoEvaluatorConfig(EvaluatorConfig):
    """OLMo's `EvaluatorConfig` plus the prompt count of the in-loop NIAH evaluators."""

    prompts: int | None = None
    """`niah_*` evaluators (`olmo_repo.ai2olmo.niah`) only: prompts per evaluation (null: its default, 100)."""


@dataclass
class RepoTrainConfig(TrainConfig):
    """OLMo's `TrainConfig` with a `RepoModelConfig`, `RepoEvaluatorConfig`s and the reference fork's
    `data_prefix`."""

    model: RepoModelConfig = field(default_factory=RepoModelConfig)
    """The model, with the RePo keys."""

    evaluators: list[RepoEvaluatorConfig] = field(default_factory=list)  # type: ignore[assignment]
    """In-loop evaluators: OLMo's, and the NIAH ones (`label: niah_*`, `olmo_repo.ai2olmo.niah`)."""

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
        """OLMo's `load`; then, with `data_prefix` set, data paths under `OLMO_DATA_URL` point into it.

        An unknown key (in the YAML or an override) raises `OLMoConfigurationError` in one line naming it and
        the nearest valid key."""
        try:
            config = super().load(path, overrides, key, validate_paths)
        except OLMoConfigurationError as e:
            raise _unknown_key_error(e) from None
        if config.data_prefix is not None:
            prefix = config.data_prefix.rstrip("/")
            for data in [config.data] + [e.data for e in config.evaluators]:
                _read_olmo_data_from(data, prefix)
        _read_data_folders(config.data)
        return config

    @classmethod
    def update_legacy_settings(cls, config: Any) -> Any:
        config = super().update_legacy_settings(config)
        if om.is_dict(config) and "model" in config:
            config.model = _translate_reference_keys(config.model, prefix="model.")
        return config


def _unknown_key_error(error: OLMoConfigurationError) -> OLMoConfigurationError:
    """OLMo re-raises OmegaConf's error for an unknown key as its text (three lines of OmegaConf details):
    say it in one line with the nearest valid key of that dataclass. Any other error is returned as it is."""
    cause = error.__context__  # OLMo raises inside its `except OmegaConfBaseException`
    if not isinstance(cause, ConfigKeyError) or not cause.full_key or not isinstance(cause.key, str):
        return error
    full_key, name = str(cause.full_key), cause.key
    prefix = full_key[: len(full_key) - len(name)] if full_key.endswith(name) else ""
    fields = (
        [f.name for f in dataclasses.fields(cause.object_type)]
        if dataclasses.is_dataclass(cause.object_type)
        else []
    )
    owner = getattr(cause.object_type, "__name__", "the config")
    return OLMoConfigurationError(not_a_key(prefix + name, fields, owner))


def _read_data_folders(data: DataConfig) -> None:
    """A `data.paths` entry that is a local folder of `scripts/prepare_data.py` stands for its shards: a data
    folder's (its data.json), a mix folder's ai2-olmo paths (its mix.json: each source's shards repeated a whole
    number of times); their ids are uint32 (`data.memmap_dtype`). Other paths are left as they are."""
    paths: list[str] = []
    for path in data.paths or []:
        root = str(path).rstrip("/")
        if (Path(root) / datafolder.MIX).is_file():
            paths += datafolder.ai2_olmo_paths(root, datafolder.mix(root))
        elif datafolder.is_data_folder(root):  # manifest() says when it is unfinished
            paths += datafolder.data_paths(root, datafolder.manifest(root))
        else:
            paths.append(path)
            continue
        data.memmap_dtype = "uint32"
    if data.paths:
        data.paths = paths


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
    try:
        if "dynamic_pe_mode" in model:
            mode = str(model.pop("dynamic_pe_mode"))
            model.pe_mode = str(modes.reference_mode(mode, f"{prefix}dynamic_pe_mode"))
        if "dynamic_pe_start_layer" in model:
            model.pe_start_layer = model.pop("dynamic_pe_start_layer")
        if "dynamic_pe_layer_ids" in model:  # the reference writes "2,5,8"; "" means all layers
            ids = model.pop("dynamic_pe_layer_ids")
            model.pe_layer_ids = modes.parse_layer_ids(ids, f"{prefix}dynamic_pe_layer_ids")
    except ValueError as e:
        raise OLMoConfigurationError(str(e)) from None
    return model
