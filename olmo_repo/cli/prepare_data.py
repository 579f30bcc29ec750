"""`scripts/prepare_data.py --model DIR --output DIR INPUT ...` (or `--mix FILE`): a run's data from real corpora,
tokenised with the model's own tokenizer by datatrove on every core (`olmo_repo.data.prepare`, `.mix`)."""

from __future__ import annotations

import argparse

from . import command, positive_int, require_extras, run

__all__ = ["main"]

PROG = "prepare_data.py"

_EPILOG = """\
INPUT is a local or s3:// file, folder or glob of jsonl (.jsonl, .jsonl.gz, .jsonl.zst) or parquet files, one
document a record, its text in the field "text". The output folder (local or s3://) holds uint32 token shards
(part-*.npy, each document followed by the model's end id), their documents' offsets (part-*.csv.gz), the
tokenizer.json they were made with and data.json, written last: what configs/olmocore/Llama-3.2-1B-repo.py and
Qwen3-0.6B-Base-repo.py read under --data-root, and what the data-tokenizer check compares with the checkpoint's.

    .venv-data/bin/python scripts/prepare_data.py --model /models/Llama-3.2-1B --output /data/llama3 \\
        '/data/dolmino/dclm/*.jsonl.zst' s3://bucket/more-text/
    .venv-data/bin/python scripts/prepare_data.py --model /models/Qwen3-0.6B-Base --mix configs/data/olmo2-stage2-mix.yaml \\
        --output /data/qwen3-mix
    # on machine R of N (scripts/slurm/prepare-data.sbatch), then once:
    .venv-data/bin/python scripts/prepare_data.py ... --nodes N --node-rank R
    .venv-data/bin/python scripts/prepare_data.py --join --output /data/llama3

A killed run continues when rerun with the same settings (the finished tasks are kept, and checked); other
settings are refused. Every input is checked first, every record of it too: a problem is one line, nothing
written. docs/data.md has the details. Exit codes: 0 done, 1 bad input (one line), 2 bad arguments, 130
interrupted.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tokenise corpora (jsonl, parquet; local or S3) with a model's own tokenizer into the token "
        "shards a run reads, with datatrove, on every core and optionally on several machines.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="files, folders or globs (local or s3://)")
    parser.add_argument(
        "--output", required=True, metavar="DIR", help="the data folder to write (local or s3://)"
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="the model whose tokenizer.json encodes the text: an HF directory or an OLMo-core checkpoint of "
        "scripts/core_convert_from_hf.py (its end id ends each document)",
    )
    parser.add_argument("--mix", metavar="FILE", help="a mix file (YAML): sources, their inputs and shares")
    parser.add_argument("--eos-token-id", type=int, metavar="ID", help="the end id (default: the model's)")
    parser.add_argument(
        "--shard-tokens",
        type=positive_int,
        metavar="N",
        help="tokens per shard at most (default 2^29: 2 GiB)",
    )
    parser.add_argument(
        "--tasks", type=positive_int, metavar="N", help="datatrove tasks (default: one per file)"
    )
    parser.add_argument(
        "--workers", type=positive_int, metavar="N", help="tasks at a time (default: every core)"
    )
    parser.add_argument(
        "--nodes", type=positive_int, default=1, metavar="N", help="machines sharing the tasks"
    )
    parser.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's rank, 0..N-1")
    parser.add_argument(
        "--join", action="store_true", help="only check the machines' parts and write data.json"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.join and not args.model:
        parser.error("--model is required (but with --join)")
    if not args.join and bool(args.inputs) == bool(args.mix):
        parser.error("give INPUT files or --mix FILE (one of them)")

    def body() -> None:
        from ..data.prepare import SHARD_TOKENS, model_tokenizer

        if not args.join:
            model_tokenizer(args.model, args.eos_token_id)  # a bad --model is said before a missing extra
        require_extras("data")
        from ..data.mix import join_output, prepare_mix
        from ..data.prepare import prepare

        options = dict(
            eos_token_id=args.eos_token_id,
            shard_tokens=args.shard_tokens or SHARD_TOKENS,
            tasks=args.tasks,
            workers=args.workers,
            nodes=args.nodes,
            node_rank=args.node_rank,
            progress=not args.no_progress,
        )
        if args.join:
            done = join_output(args.output)
        elif args.mix:
            done = prepare_mix(args.model, args.mix, args.output, **options)
        else:
            done = prepare(args.model, args.inputs, args.output, **options)
        print(
            done.summary()
            if done
            else f"{args.output}: this machine's tasks are done; --join once every machine's are"
        )

    return run(PROG, body)
