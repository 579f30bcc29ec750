"""Local copies of what a training config reads remotely: `scripts/fetch.py CONFIG --to DIR|s3://...`.

Modules: `plan` (the remote files of a config, and the config rewritten to the copies), `remote` (size,
ETag and byte streams of http(s) and s3 files), `targets` (a local directory or an s3:// prefix, and what each
file needs there), `transfer` (resumable verified downloads, in parallel), `copies` (`fetch_config`: plan, checks,
fetch, summary, config; what `olmo_repo.cli.fetch` calls). Data made from corpora is `olmo_repo.data`'s. Nothing
here imports torch or ai2-olmo at import time.
"""

from .errors import FetchError

__all__ = ["GROUPS", "FetchError"]

GROUPS = ("data", "checkpoint", "eval")
"""`--only` values: training data (and a remote tokenizer), load_path's files, the evaluators' data. Here, not in
`plan`, so that the command's --help needs neither requests nor boto3."""
