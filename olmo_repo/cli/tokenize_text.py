"""`scripts/tokenize_text.py --model DIR --output DIR [--text FILE ...]`: token files made from text with a model's
own tokenizer, the `--data-root` of a run continuing that model (`olmo_repo.data.tokens`)."""

from __future__ import annotations

import argparse

from ..data.tokens import TOKENS_FILE
from . import command, run

__all__ = ["main"]

PROG = "tokenize_text.py"

_EPILOG = f"""\
The output folder holds {TOKENS_FILE} (the ids as raw uint32, each document followed by the end id) and a copy
of the tokenizer.json they were made with: what configs/olmocore/smollm2-repo.py, Llama-3.2-1B-repo.py and
Qwen3-0.6B-Base-repo.py read under --data-root, and what a run's data-tokenizer check compares with its
stage-1 checkpoint's tokenizer.

    .venv-core/bin/python scripts/smollm2.py --output runs/smollm2-135m
    .venv-core/bin/python scripts/tokenize_text.py --model runs/smollm2-135m --output runs/smollm2-pydoc
    .venv-core/bin/python scripts/tokenize_text.py --model /models/Llama-3.2-1B --output /data/llama3-tokens \\
        --text corpus/*.txt

Written in a staging folder beside --output and renamed at the end (a kill leaves no partial folder). Exit
codes: 0 written, 1 bad input (one line, nothing written), 2 bad arguments, 130 interrupted.
"""


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tokenise text with a model's own tokenizer into token files for training it further: "
        "by default Python's documentation as it ships with Python (pydoc_data.topics, ~65,000 words).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="the model whose tokenizer.json encodes the text: an HF directory (its config.json's "
        "eos_token_id ends each document) or an OLMo-core checkpoint of scripts/core_convert_from_hf.py "
        "(the end id it records)",
    )
    parser.add_argument(
        "--output", required=True, metavar="DIR", help="the folder to write (must not exist unless --force)"
    )
    parser.add_argument(
        "--text",
        nargs="+",
        metavar="FILE",
        help="UTF-8 text files, one document each (default: Python's own documentation, pydoc_data.topics, "
        "one document per topic)",
    )
    parser.add_argument(
        "--eos-token-id",
        type=int,
        metavar="ID",
        help="the id that ends each document (default: the model's end id, the first if it lists several)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace --output if it holds only this command's files"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    def body() -> None:
        from ..data.tokens import python_docs, text_files, tokenize_text

        documents = text_files(args.text) if args.text else python_docs()
        written = tokenize_text(
            args.model,
            args.output,
            documents,
            eos_token_id=args.eos_token_id,
            force=args.force,
            progress=not args.no_progress,
        )
        print(written.summary(documents.source))

    return run(PROG, body)
