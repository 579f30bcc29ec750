"""A mix (`scripts/prepare_data.py --mix FILE`): several sources, each tokenised into a data folder of its own
(`olmo_repo.data.prepare`), and `mix.json`, the config fragment both trainers read (`olmo_repo.data.folder`).

The mix file (YAML; `configs/data/olmo2-stage2-mix.yaml` is the OLMo 2 stage-2 mix):

    tokens: 50_000_000_000     # the run's tokens: what OLMo-core's mixture draws, what shares are of
    sources:
      - name: dclm             # the source's folder under --output
        inputs: [/data/dolmino-mix-1124/data/dclm]
        share: 0.5             # its fraction of the run's tokens ...
      - name: math
        inputs: ['s3://bucket/math/*.jsonl.zst']
        repeat: 2              # ... or, in a mix of repetitions, how many times the run reads it

Either every source has a `share` (they sum to 1; `tokens` is then required) or every source a whole `repeat`.
From the token counts of the folders, `mix.json` holds for each source OLMo-core's `SourceMixtureConfig` keys
(`source_name`, `target_ratio`: the share, or repeat x tokens over the sum; `max_repetition_ratio`: what that
share needs of the source's tokens, at least 1; `paths`) and ai2-olmo's `data.paths`: each source's shards
repeated a whole number of times (the repeat, or the share x tokens over the source's tokens, rounded, at least
1), with the shares that rounding gives. Changing shares or tokens and rerunning rewrites `mix.json` only: the
folders' settings are their inputs, not their shares.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from ..errors import RepoError
from .folder import MIX, MIX_FORMAT
from .prepare import Prepared, execute, join, model_tokenizer, plan
from .store import open_folder, write_whole

__all__ = ["Mix", "MixSource", "join_mix", "join_output", "prepare_mix", "read_mix"]

_KEYS = {"name", "inputs", "share", "repeat"}
_RECORD = ".mix.json"  # the mix file as read, in the output: what --join (on any machine) joins


@dataclass(frozen=True)
class MixSource:
    """One source of a mix: its folder name, inputs, and share of the tokens or whole repetition."""

    name: str
    inputs: list[str]
    share: float | None = None
    repeat: int | None = None


@dataclass(frozen=True)
class Mix:
    """A mix file: its sources and the run's tokens (required with shares)."""

    sources: list[MixSource]
    tokens: int | None


def _source(entry: Any, where: str) -> MixSource:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise RepoError(f"{where}: each source is a mapping with a name")
    name = entry["name"]
    if unknown := sorted(set(entry) - _KEYS):
        raise RepoError(
            f"{where}: source {name} has unknown key {unknown[0]} (keys: {', '.join(sorted(_KEYS))})"
        )
    if "/" in name or name.startswith(".") or name == MIX:
        raise RepoError(f"{where}: source name {name!r} is not a folder name")
    inputs = entry.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs or not all(isinstance(i, str) for i in inputs):
        raise RepoError(f"{where}: source {name} has no inputs (a list of files, folders or globs)")
    share, repeat = entry.get("share"), entry.get("repeat")
    if (share is None) == (repeat is None):
        raise RepoError(
            f"{where}: source {name} needs a share (0 < share <= 1) or a repeat (1, 2, ...), not both"
        )
    if share is not None and not (isinstance(share, (int, float)) and 0 < share <= 1):
        raise RepoError(f"{where}: source {name}: share {share!r} is not in (0, 1]")
    if repeat is not None and not (isinstance(repeat, int) and not isinstance(repeat, bool) and repeat >= 1):
        raise RepoError(f"{where}: source {name}: repeat {repeat!r} is not a whole number of at least 1")
    return MixSource(name, list(inputs), None if share is None else float(share), repeat)


def read_mix(path: str | PathLike) -> Mix:
    """A mix file, checked: `RepoError` in one line naming the file and the source."""
    import yaml

    where = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RepoError(f"--mix {path} does not exist") from None
    except yaml.YAMLError as e:
        raise RepoError(f"--mix {path} is not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list) or not data["sources"]:
        raise RepoError(f"{where}: no sources (a list under `sources:`)")
    sources = [_source(entry, where) for entry in data["sources"]]
    if len({s.name for s in sources}) != len(sources):
        raise RepoError(f"{where}: two sources have one name")
    tokens = data.get("tokens")
    if tokens is not None and not (isinstance(tokens, int) and tokens > 0):
        raise RepoError(f"{where}: tokens {tokens!r} is not a positive whole number")
    shares = [s.share for s in sources]
    if any(s is None for s in shares) and any(s is not None for s in shares):
        raise RepoError(f"{where}: give every source a share, or every source a repeat")
    if shares[0] is not None:
        if not math.isclose(sum(shares), 1.0, abs_tol=1e-6):  # type: ignore[arg-type]
            raise RepoError(f"{where}: the shares sum to {sum(shares):.6g}, not 1")  # type: ignore[arg-type]
        if tokens is None:
            raise RepoError(f"{where}: a mix of shares needs `tokens:` (the run's tokens the shares are of)")
    return Mix(sources, tokens)


def _check_mix_output(output: str, mix: Mix) -> None:
    out = open_folder(output.rstrip("/"))
    if not out.exists(""):
        return
    names = {Path(p.rstrip("/")).name for p in out.ls("", detail=False)}
    if foreign := sorted(names - {s.name for s in mix.sources} - {MIX, _RECORD}):
        raise RepoError(
            f"--output {output} holds files this mix does not write ({', '.join(foreign[:5])}): choose another folder"
        )


def prepare_mix(
    model: str | PathLike, mix_file: str | PathLike, output: str, *, eos_token_id: int | None = None,
    nodes: int = 1, **options: Any,
) -> Prepared | None:  # fmt: skip
    """Every source of the mix file into its folder under `output` (all checked before any is written), then,
    on one machine, `mix.json`; on one of several, this machine's tasks of every source (`join_mix` then)."""
    mix = read_mix(mix_file)
    _check_mix_output(output, mix)
    tokenizer = model_tokenizer(model, eos_token_id)
    root = output.rstrip("/")
    plans = [
        plan(tokenizer, s.inputs, f"{root}/{s.name}", nodes=nodes, flag=f"source {s.name}: input", **options)
        for s in mix.sources
    ]
    record = {"tokens": mix.tokens, "sources": [vars(s) for s in mix.sources]}
    write_whole(open_folder(root), _RECORD, json.dumps(record))
    for checked in plans:
        execute(checked)
    return join_mix(output) if nodes == 1 else None


def _fragment(mix: Mix, folders: list[Prepared], root: str) -> dict[str, Any]:
    """mix.json's content from the sources and their finished folders."""
    manifests = [json.loads(open_folder(f"{root}/{s.name}").read_text("data.json")) for s in mix.sources]
    total = sum((s.repeat or 0) * f.tokens for s, f in zip(mix.sources, folders))
    sources, ai2 = [], []
    for source, folder, data in zip(mix.sources, folders, manifests):
        paths = [f"{source.name}/{shard['path']}" for shard in data["shards"]]
        if source.share is not None:
            wanted = source.share * mix.tokens / folder.tokens  # type: ignore[operator]
            ratio, repeat = source.share, max(1, round(wanted))
            max_repetition = max(1.0, math.ceil(wanted * 1000) / 1000)
        else:
            ratio, repeat = source.repeat * folder.tokens / total, source.repeat  # type: ignore[operator]
            max_repetition = float(source.repeat)  # type: ignore[arg-type]
        sources.append(
            dict(
                source_name=source.name,
                target_ratio=ratio,
                max_repetition_ratio=max_repetition,
                paths=paths,
                tokens=folder.tokens,
                documents=folder.documents,
                ai2_olmo_repeat=repeat,
            )  # fmt: skip
        )
        ai2 += paths * repeat
    read = sum(s["ai2_olmo_repeat"] * s["tokens"] for s in sources)
    for s in sources:
        s["ai2_olmo_share"] = s["ai2_olmo_repeat"] * s["tokens"] / read
    first = manifests[0]
    return {
        "format": MIX_FORMAT,
        "tokens": mix.tokens,
        "tokenizer": f"{mix.sources[0].name}/{first['tokenizer']}",
        "eos_token_id": first["eos_token_id"],
        "vocab_size": first["vocab_size"],
        "dtype": "uint32",
        "sources": sources,
        "ai2_olmo": {"paths": ai2, "memmap_dtype": "uint32"},
    }


def join_output(output: str) -> Prepared:
    """`--join`: a mix folder's (`join_mix`) or a single folder's (`prepare.join`)."""
    return join_mix(output) if open_folder(output.rstrip("/")).isfile(_RECORD) else join(output)


def join_mix(output: str) -> Prepared:
    """Join every source's folder (`prepare.join`) and write `mix.json`; returns the whole mix's count."""
    root = output.rstrip("/")
    out = open_folder(root)
    recorded = json.loads(out.read_text(_RECORD))
    mix = Mix([MixSource(**s) for s in recorded["sources"]], recorded["tokens"])
    folders = [join(f"{root}/{s.name}") for s in mix.sources]
    write_whole(out, MIX, json.dumps(_fragment(mix, folders, root), indent=1))
    return Prepared(
        output,
        sum(f.shards for f in folders),
        sum(f.tokens for f in folders),
        sum(f.documents for f in folders),
        folders[0].eos_token_id,
    )
