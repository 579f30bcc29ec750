"""Configuration: OLMo's config dataclasses plus one position mode per layer and how f_phi is trained.

`RepoModelConfig` adds the position keys of `olmo_repo.modes.PositionKeys` (`pe_mode`, `pe_start_layer`,
`pe_layer_ids`, and the index blend's `pe_blend_init`, `pe_blend_steps`), declared there once for every
config of the project; which layers they select, and the rules they must follow, are `olmo_repo.modes`.
`RepoTrainConfig` adds the section `f_phi` (`olmo_repo.modes.FPhiTraining`: f_phi's own learning-rate
multiplier and weight decay, or f_phi alone), as OLMo-core's run config does. The reference fork's keys
(`model.dynamic_pe_mode`, `model.dynamic_pe_start_layer`, `model.dynamic_pe_layer_ids`,
`model.dynamic_pe_init_pdrop`, `model.dynamic_pe_dropout_anneal_step`, top-level `data_prefix`) load too and
mean the same thing. As in the reference fork, `data_prefix` is a local copy of http://olmo-data.org: the
official configs name their data by URL, and with `data_prefix` set those files are read from the copy
instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmo.aliases import PathOrStr
from olmo.config import BlockType, DataConfig, EvaluatorConfig, ModelConfig, TrainConfig
from olmo.exceptions import OLMoConfigurationError
from olmo.util import resource_path
from omegaconf import DictConfig
from omegaconf import OmegaConf as om
from omegaconf.errors import ConfigKeyError, ValidationError

from .. import modes
from ..data import folder as datafolder
from ..errors import not_a_key
from ..modes import FPhiTraining, PositionKeys, PositionMode, layer_modes, repo_layer_ids
from ..paths import is_url

__all__ = [
    "PositionMode",
    "RepoEvaluatorConfig",
    "RepoModelConfig",
    "RepoTrainConfig",
    "f_phi_has_own_group",
    "layer_modes",
    "olmo2_model_config",
    "repo_layer_ids",
]

OLMO_DATA_URL = "http://olmo-data.org"
"""Where the released OLMo-2 configs (and so the official ones here) read their data from."""


@dataclass
class RepoModelConfig(PositionKeys, ModelConfig):
    """OLMo's `ModelConfig` plus the position keys (`modes.PositionKeys`). Validated on construction."""

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
            modes.check_index_blend(
                self.pe_blend_init,
                self.pe_blend_steps,
                has_repo=bool(repo_layer_ids(self)),
                prefix="model.",
                training=True,
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

    hf_config: dict[str, Any] | None = None
    """The config.json of the Hugging Face model this run continues, whole: `scripts/convert_from_hf.py` records it
    in the checkpoint it writes, and a run takes it from its `load_path` (or the checkpoint it resumes) into every
    checkpoint it saves, so that `scripts/convert_to_hf.py` gives the stock model's context length, token ids and
    other keys back with the run's weights and RePo keys. Not set by hand; null for a model trained from scratch."""

    f_phi: FPhiTraining = field(default_factory=FPhiTraining)
    """How f_phi is trained (`modes.FPhiTraining`): its learning-rate multiplier on the schedule, its own weight
    decay, or f_phi alone (`--f_phi.lr_multiplier=10`, `--f_phi.weight_decay=0`, `--f_phi.only=true`)."""

    def __post_init__(self) -> None:
        self.validate_f_phi()

    def validate_f_phi(self) -> None:
        """Raise one `OLMoConfigurationError` naming the bad `f_phi.*` key (the rule set's message)."""
        try:
            self.f_phi.check(has_repo=bool(repo_layer_ids(self.model)))
        except ValueError as e:
            raise OLMoConfigurationError(str(e)) from None

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
        the nearest valid key; a value of the wrong type, in one line naming the key."""
        try:
            config = super().load(path, overrides, key, validate_paths)
        except OLMoConfigurationError as e:
            raise _one_line_error(e) from None
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


def f_phi_has_own_group(f_phi: FPhiTraining) -> bool:
    """Whether f_phi gets a param group of its own in OLMo's optimizer: a learning rate or weight decay other
    than the base's. Otherwise it stays in OLMo's decay group, so the paper's runs and their checkpoints keep
    OLMo's two groups."""
    return f_phi.lr_multiplier != 1.0 or f_phi.weight_decay is not None


def _one_line_error(error: OLMoConfigurationError) -> OLMoConfigurationError:
    """OLMo re-raises OmegaConf's errors as their text (three lines of OmegaConf details): an unknown key is
    said in one line with the nearest valid key of that dataclass, a value of the wrong type in one line
    naming the key (`model.pe_blend_steps=1.5: Value '1.5' of type 'float' could not be converted to
    Integer`). Any other error is returned as it is."""
    cause = error.__context__  # OLMo raises inside its `except OmegaConfBaseException`
    if isinstance(cause, ValidationError) and cause.full_key and not isinstance(cause, ConfigKeyError):
        return OLMoConfigurationError(f"{cause.full_key}: {str(cause.msg).splitlines()[0]}")
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


def fetch_file(path: str) -> Path | None:
    """`datafolder.Fetch` through ai2-olmo's I/O: a local file, or a URL's copy in its download cache."""
    if not is_url(path):
        return datafolder.local_file(path)
    folder, _, name = path.rpartition("/")
    try:
        return Path(resource_path(folder, name))
    except FileNotFoundError:
        return None


def _read_data_folders(data: DataConfig) -> None:
    """A `data.paths` entry that is a folder of `scripts/prepare_data.py` (local, or a URL ai2-olmo reads) stands
    for its shards: a data folder's (its data.json), a mix folder's ai2-olmo paths (its mix.json: each source's
    shards repeated a whole number of times); their ids are uint32 (`data.memmap_dtype`). Other paths are left as
    they are."""
    paths: list[str] = []
    for path in data.paths or []:
        root = str(path).rstrip("/")
        if root.endswith(".npy"):  # a file (OLMo's mixes list thousands, remote): not looked up as a folder
            paths.append(path)
            continue
        if (mix := datafolder.mix(root, fetch_file)) is not None:
            paths += datafolder.ai2_olmo_paths(root, mix)
        elif datafolder.is_data_folder(root, fetch_file):  # manifest() says when it is unfinished
            paths += datafolder.data_paths(root, datafolder.manifest(root, fetch_file))
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


_REFERENCE_KEYS = {
    "dynamic_pe_mode": "pe_mode",
    "dynamic_pe_start_layer": "pe_start_layer",
    "dynamic_pe_layer_ids": "pe_layer_ids",
    **modes.REFERENCE_BLEND_KEYS,
}
"""The reference fork's model keys and the position keys here."""


def _translate_reference_keys(model: Any, prefix: str) -> Any:
    """Map the reference fork's `dynamic_pe_*` keys onto `pe_*`, refusing to mix the two spellings."""
    if not isinstance(model, DictConfig):
        return model
    old = [k for k in _REFERENCE_KEYS if k in model]
    if not old:
        return model
    mixed = [k for k in _REFERENCE_KEYS.values() if k in model]
    if mixed:
        raise OLMoConfigurationError(
            f"{prefix}{old[0]} and {prefix}{mixed[0]} are both set: use the pe_* keys or the reference "
            "fork's dynamic_pe_* keys, not both"
        )
    model = model.copy()
    try:
        for key in old:
            value = model.pop(key)
            if key == "dynamic_pe_mode":
                value = str(modes.reference_mode(str(value), f"{prefix}dynamic_pe_mode"))
            elif key == "dynamic_pe_layer_ids":  # the reference writes "2,5,8"; "" means all layers
                value = modes.parse_layer_ids(value, f"{prefix}dynamic_pe_layer_ids")
            model[_REFERENCE_KEYS[key]] = value
    except ValueError as e:
        raise OLMoConfigurationError(str(e)) from None
    return model
