"""What a training config reads from remote storage, and the same config pointed at local copies.

`config_sources` lists every remote path of a loaded config in its order: the training data (`data.paths`,
`data.datasets`, `data.label_mask_paths`), a remote `tokenizer.identifier`, the files of `load_path` that a
stage-1 start or a resume reads, and the evaluators' data. `rewrite_config` writes the YAML back with
those paths replaced by their copies, every other key (and the order of the data) unchanged, and
`check_rewritten_config` proves that the written file reads exactly those copies.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..paths import is_url
from . import GROUPS
from .errors import FetchError
from .remote import SCHEMES, NotFound, RemoteFile, list_s3, stat

__all__ = [
    "GROUPS",
    "Probed",
    "Source",
    "check_rewritten_config",
    "checkpoint_sources",
    "config_sources",
    "load_config",
    "local_name",
    "probe",
    "rewrite_config",
]


# The files of an unsharded checkpoint that a start from load_path reads; optim.pt and train.pt are skipped
# when the config resets that state (as `check_load_path_files` in olmo_repo/ai2olmo/preflight.py does).
_UNSHARDED = ("config.yaml", "model.pt")
_RESETS = {"optim.pt": "reset_optimizer_state", "train.pt": "reset_trainer_state"}


@dataclass(frozen=True)
class Source:
    url: str
    group: str
    """One of GROUPS."""
    key: str
    """The config key that names it (a checkpoint file: load_path)."""


def load_config(path: str | Path, overrides: list[str]) -> Any:
    """The config as the trainer sees it (`RepoTrainConfig.load`), without checking that paths exist."""
    if not Path(path).is_file():
        raise FetchError(f"config file {path} does not exist (expected a YAML file such as configs/*.yaml)")
    from olmo.exceptions import OLMoConfigurationError  # heavy: after argument parsing

    from ..ai2olmo.config import RepoTrainConfig

    try:
        return RepoTrainConfig.load(path, overrides, validate_paths=False)
    except OLMoConfigurationError as e:
        raise FetchError(f"{path}: {str(e).splitlines()[0]}") from None


def _is_remote(path: Any) -> bool:
    return isinstance(path, str) and is_url(path) and not path.startswith("file://")


def _data_fields(data: Any) -> list[tuple[str, list[str]]]:
    """(key, paths) of a DataConfig, in the order the dataset concatenates them."""
    fields = []
    if data.paths:
        fields.append(("paths", list(data.paths)))
    for label, paths in (data.datasets or {}).items():
        fields.append((f"datasets.{label}", list(paths)))
    if data.label_mask_paths:
        fields.append(("label_mask_paths", list(data.label_mask_paths)))
    return fields


def config_sources(cfg: Any, only: tuple[str, ...] = GROUPS) -> list[Source]:
    """Every remote file the config reads, in config order, except the checkpoint (`checkpoint_sources`)."""
    sources: list[Source] = []
    if "data" in only:
        for field, paths in _data_fields(cfg.data):
            sources += [Source(p, "data", f"data.{field}[{i}]") for i, p in enumerate(paths) if _is_remote(p)]
        if _is_remote(cfg.tokenizer.identifier):
            sources.append(Source(cfg.tokenizer.identifier, "data", "tokenizer.identifier"))
    if "eval" in only:
        for j, evaluator in enumerate(cfg.evaluators):
            for field, paths in _data_fields(evaluator.data):
                key = f"evaluators[{j}].data.{field}"
                sources += [Source(p, "eval", f"{key}[{i}]") for i, p in enumerate(paths) if _is_remote(p)]
    _check_schemes(sources)
    return sources


def _check_schemes(sources: list[Source]) -> None:
    bad = [s for s in sources if urlparse(s.url).scheme not in SCHEMES]
    if bad:
        raise FetchError(
            f"{bad[0].key}={bad[0].url}: {urlparse(bad[0].url).scheme}:// is not supported (fetch reads "
            f"{', '.join(s + '://' for s in SCHEMES)}); copy those files yourself"
        )


def checkpoint_sources(cfg: Any, timeout: float) -> list[Source]:
    """The files of a remote `load_path` that the start reads. Unsharded (config.yaml, model.pt, optim.pt
    and train.pt unless reset): over http(s) and s3. Sharded (olmo_core): every file, where the server can
    list them (s3)."""
    load_path = cfg.load_path
    if not _is_remote(load_path):
        return []
    base = str(load_path).rstrip("/")
    _check_schemes([Source(base, "checkpoint", "load_path")])
    wanted = list(_UNSHARDED) + [name for name, reset in _RESETS.items() if not getattr(cfg, reset)]
    if urlparse(base).scheme == "s3":
        listed = {f.url[len(base) + 1 :] for f in list_s3(base)}
        if not listed:
            raise FetchError(f"load_path={load_path}: no files under that prefix (check the bucket and path)")
        names = wanted if "model.pt" in listed else sorted(listed)
    else:
        if not base.endswith("-unsharded"):
            try:
                stat(f"{base}/model.pt", timeout)
            except NotFound:
                raise FetchError(
                    f"load_path={load_path} has no model.pt, so it is a sharded checkpoint, and an http server "
                    "cannot list its files: fetch an unsharded checkpoint (stepN-unsharded) or copy it from s3"
                ) from None
        names = wanted
    return [Source(f"{base}/{name}", "checkpoint", "load_path") for name in names]


def local_name(url: str) -> str:
    """Where a URL's copy lives under the target: `HOST/PATH` (port as `HOST_PORT`), `s3/BUCKET/KEY`."""
    parsed = urlparse(url)
    host = parsed.netloc.replace(":", "_")
    parts = [p for p in unquote(parsed.path).split("/") if p]
    if not host or not parts or any(p in (".", "..") for p in parts):
        raise FetchError(f"{url}: cannot name a local copy of this URL")
    prefix = ["s3", host] if parsed.scheme == "s3" else [host]
    return posixpath.join(*prefix, *parts)


@dataclass(frozen=True)
class Probed:
    source: Source
    remote: RemoteFile | None
    problem: str | None
    """Why it cannot be fetched (not found, unreachable), when remote is None."""


def probe(sources: list[Source], jobs: int, timeout: float) -> list[Probed]:
    """Size and ETag of every source (HEAD requests in parallel), in order. One file per server first: a
    server that cannot be reached fails its files at once instead of one timeout per file."""

    def one(source: Source) -> Probed:
        try:
            return Probed(source, stat(source.url, timeout), None)
        except FetchError as e:
            return Probed(source, None, str(e))

    by_server: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        parsed = urlparse(source.url)
        by_server.setdefault(f"{parsed.scheme}://{parsed.netloc}", []).append(i)
    results: dict[int, Probed] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        firsts = [ids[0] for ids in by_server.values()]
        for i, result in zip(firsts, pool.map(one, [sources[i] for i in firsts])):
            results[i] = result
        rest = []
        for server, ids in by_server.items():
            first = results[ids[0]]
            if first.remote is None and "unreachable" in (first.problem or ""):
                for i in ids[1:]:
                    results[i] = Probed(sources[i], None, f"{server} unreachable (as for {first.source.url})")
            else:
                rest += ids[1:]
        for i, result in zip(rest, pool.map(one, [sources[i] for i in rest])):
            results[i] = result
    return [results[i] for i in range(len(sources))]


def rewrite_config(path: str | Path, overrides: list[str], cfg: Any, copies: dict[str, str]) -> str:
    """The YAML of `path` + `overrides` with every path in `copies` ({remote: copy}) replaced by its copy.

    Only those entries change; interpolations, comments' keys and every other value stay as written. A list
    that an interpolation or resolver builds is written out in full (its entries are then plain strings).
    """
    from omegaconf import ListConfig, OmegaConf

    raw = OmegaConf.load(str(path))
    if overrides:
        raw = OmegaConf.merge(raw, OmegaConf.from_dotlist(overrides))

    def replace_list(node: Any, key: str, effective: list[str]) -> None:
        current = node.get(key) if node is not None else None
        if not any(p in copies for p in effective):
            return
        if isinstance(current, ListConfig) and len(current) == len(effective):
            for i, p in enumerate(effective):
                if p in copies:
                    current[i] = copies[p]
        else:
            node[key] = [copies.get(p, p) for p in effective]

    def replace_data(node: Any, data: Any) -> None:
        if node is None:
            return
        if data.paths:
            replace_list(node, "paths", list(data.paths))
        if data.label_mask_paths:
            replace_list(node, "label_mask_paths", list(data.label_mask_paths))
        for label, paths in (data.datasets or {}).items():
            if any(p in copies for p in paths):
                if node.get("datasets") is None:
                    node["datasets"] = {}
                replace_list(node["datasets"], label, list(paths))

    replace_data(raw.get("data"), cfg.data)
    for j, evaluator in enumerate(cfg.evaluators):
        replace_data(raw["evaluators"][j].get("data"), evaluator.data)
    if cfg.tokenizer.identifier in copies:
        raw.tokenizer.identifier = copies[cfg.tokenizer.identifier]
    if cfg.load_path is not None and str(cfg.load_path).rstrip("/") in copies:
        raw.load_path = copies[str(cfg.load_path).rstrip("/")]
    return OmegaConf.to_yaml(raw)


def _read_paths(cfg: Any) -> list[Any]:
    """Every path a config reads, in order: tokenizer, load_path, then the data of training and evaluators."""
    out: list[Any] = [cfg.tokenizer.identifier, cfg.load_path and str(cfg.load_path).rstrip("/")]
    for data in [cfg.data] + [e.data for e in cfg.evaluators]:
        out += list(data.paths or []) + list(data.label_mask_paths or [])
        out += [(k, list(v)) for k, v in (data.datasets or {}).items()]
    return out


def check_rewritten_config(path: str | Path, cfg: Any, copies: dict[str, str]) -> None:
    """FetchError unless the config written to `path` reads exactly the copies (`{remote: copy}`) of what
    `cfg` reads, in the same order, and every other path as `cfg` does."""

    def mapped(value: Any) -> Any:
        if isinstance(value, tuple):
            return (value[0], [copies.get(p, p) for p in value[1]])
        return copies.get(value, value) if isinstance(value, str) else value

    if _read_paths(load_config(path, [])) != [mapped(v) for v in _read_paths(cfg)]:
        raise FetchError(f"{path}: the written config does not read the fetched copies; please report this")
