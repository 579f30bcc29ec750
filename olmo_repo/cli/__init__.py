"""The commands, one module per script in `scripts/`: each has `main(argv: list[str] | None = None) -> int`.

A command parses its arguments before any heavy import (so `--help` and argument errors answer at once),
then calls the library through `run`. Every command follows one convention:

- exit 0: done;
- exit 2: a usage error, said by argparse (`usage: ...` and `PROG: error: ...`);
- exit 1: a runtime error, i.e. bad, missing or corrupt input or a refused output (`user_errors`), or an extra
  that is not installed (`olmo_repo.errors.missing_extra`: which one, and how to install it), said in one line
  `PROG: error: ...` on stderr (`fail`), with no traceback; a bug keeps its traceback;
- exit 130: Ctrl-C (`PROG: interrupted`).

The exit status says whether the work was done, whatever became of the terminal: a command whose standard output
or error is closed (`| head`) or whose log's disk is full goes on quietly (`olmo_repo.terminal`) and exits 0 when
its product is whole: its files, or, for a command whose product is what it prints (`flops.py`, a `--dry-run`),
its printout, so that there a lost standard output is exit 1.

PROG is the script's file name (`fetch.py`), the parser's `prog`. The scripts are three lines that call `main`.

Each `main` is a `command`: called with `argv` (a test, in-process) it returns its status; called without (the
script, the console script, `python -m`), the process is the command, and it ends there with that status,
without the interpreter's module teardown (`olmo_repo.upstream.python`: ~2 s of CPU after a training run).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import RepoError, extras_missing, missing_extra
from ..integrity import require_model_dir
from ..modes import PositionSource
from ..output import check_distinct, check_replaceable
from ..paths import is_url
from ..terminal import keep_working_without_terminal
from ..upstream.olmo_core import quiet_optional_backends
from ..upstream.python import exit_without_teardown

quiet_optional_backends()  # OLMo-core's commands: their output and their one-line errors without its TE warning

__all__ = [
    "add_positions_argument",
    "check_input",
    "command",
    "fail",
    "freeze_imported",
    "from_hf_command",
    "positive_int",
    "require_extras",
    "run",
    "user_errors",
]

Errors = tuple[type[BaseException], ...]


def positive_int(text: str) -> int:
    """argparse `type` of a count or length: an integer of at least 1 (argparse names the flag otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def add_positions_argument(parser: argparse.ArgumentParser) -> None:
    """`--positions` of the commands that score or show a model's positions (eval.py, explore.py,
    plot_positions.py): what its RePo layers rotate by (`modes.PositionSource`, set as the model's `pe_positions`)."""
    parser.add_argument(
        "--positions",
        choices=list(PositionSource.__members__),
        default=PositionSource.learned.value,
        help="what the RePo layers rotate q and k by, and so what is scored or shown: 'learned' (f_phi's positions, "
        "the model as trained; default), 'index' (the token index: each RePo layer as the RoPE layer it replaced) "
        "or 'constant' (one position for every token: as NoPE). index and constant are an ablation of what the "
        "learned positions contribute; they set the model's pe_positions at load and are refused for a model "
        "without RePo layers",
    )


def check_input(input: str, output: str, force: bool) -> None:
    """A converter's `--input` exists and its `--output` may be written (`olmo_repo.output`): what a command
    checks before importing a framework, so that a typo answers at once. Raises as `run` expects."""
    if not is_url(input) and not Path(input).exists():
        raise FileNotFoundError(f"--input {input} does not exist")
    check_distinct(input, output)
    check_replaceable(output, force)


def require_extras(*extras: str) -> None:
    """`RepoError` naming the first of `extras` that is not installed, and how to get it
    (`olmo_repo.errors.extras_missing`): what a command checks after its cheap input checks, before it imports
    the extra's modules (seconds)."""
    if line := extras_missing(*extras):
        raise RepoError(line)


Main = Callable[[list[str] | None], int]


def command(main: Main) -> Main:
    """A command's `main(argv=None) -> status` (see the module's docstring): without `argv`, its output streams
    are the terminal's, whose loss ends the printing, not the work (`olmo_repo.terminal`), and the process ends
    with the status once `main` returns, its threads joined, its exit handlers run and its output flushed, as
    the interpreter would, but without tearing its modules down. An exception (a bug's traceback, argparse's
    exit), or a profiler or tracer at work (`python -m cProfile -o`, coverage, a debugger: they write their
    results after `main`), leaves the process as before."""

    @functools.wraps(main)
    def process(argv: list[str] | None = None) -> int:
        if argv is None:
            keep_working_without_terminal()
        status = main(argv)
        if argv is None and sys.getprofile() is None and sys.gettrace() is None:
            exit_without_teardown(status)
        return status

    return process


def freeze_imported() -> None:
    """Put every object alive now out of the garbage collector's reach until exit: called by a training command
    once its trainer's modules are imported (and by the test sessions after collection). Those are about a
    million objects that never become garbage, which each full collection would scan again: ai2-olmo's trainer
    runs one at every checkpoint save and restore (~0.3 s each on a 2-core CPU; a 2-step CPU run spent 1.7 of
    its 10.5 s in six of them). They are unfrozen at exit, so that a teardown finds them as before (Triton's
    extension reports objects still alive at its teardown as leaks); a `command` run as the process skips the
    teardown."""
    gc.freeze()
    atexit.register(gc.unfreeze)


def fail(prog: str, error: BaseException | str) -> int:
    """Print `prog: error: ...` (the first line of the error) on stderr; return the exit status 1. An error
    whose first line is only a header ("Class validation error for validator 'x':", huggingface_hub's
    config validators) is said by its cause, which names the key."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if message.endswith(":") and isinstance(error, BaseException) and error.__cause__ is not None:
        return fail(prog, error.__cause__)
    if isinstance(error, KeyError) and message.startswith(("'", '"')):
        message = message[1:-1]  # KeyError quotes its message
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1


def user_errors() -> Errors:
    """The errors a user's input causes: this project's `RepoError`, a missing or unreadable file (OSError), a
    bad value or key (ValueError, KeyError), OLMo's config and checkpoint errors and huggingface_hub's config
    validation. A library's error class is looked up only once the library is loaded: a command that has not
    imported it cannot have raised it (and `--help` of a light command stays free of torch and OLMo)."""
    errors: list[type[BaseException]] = [RepoError, OSError, ValueError, KeyError]
    for module, name in (
        ("olmo.exceptions", "OLMoError"),
        ("huggingface_hub.errors", "StrictDataclassError"),
    ):
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def run(
    prog: str,
    body: Callable[[], int | None],
    errors: Callable[[], Errors] = user_errors,
    needs: tuple[str, ...] = (),
) -> int:
    """`body()` under the convention: its exit status (None: 0); for an error of `errors()` or a missing extra
    (of `needs`, checked first, or one the body imports) one line `prog: error: ...` and 1; on Ctrl-C
    `prog: interrupted` and 130. Any other exception propagates."""
    if line := extras_missing(*needs):
        return fail(prog, line)
    try:
        return body() or 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except ImportError as e:
        if (line := missing_extra(e)) is None:
            raise
        return fail(prog, line)
    except Exception as e:
        if isinstance(e, errors()):
            return fail(prog, e)
        raise


def from_hf_command(
    prog: str,
    description: str,
    output: str,
    convert: Callable[[str, str, bool], object],
    argv: list[str] | None,
    extra: str,
) -> int:
    """A converter from a Hugging Face directory to a trainer's checkpoint (`convert_from_hf.py`,
    `core_convert_from_hf.py`): the same flags, and the same checks of --input (there, a model directory, its
    weights intact) and --output before `convert(input, output, force)` (which imports the trainer of `extra`)
    runs."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--input", required=True, help="local HF directory (config.json and safetensors)")
    parser.add_argument("--output", required=True, help=f"{output} to write (must not exist unless --force)")
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)

    def body() -> None:
        require_model_dir(args.input)  # missing, the wrong kind or damaged: said before torch loads
        check_input(args.input, args.output, args.force)
        require_extras(extra)
        print(f"wrote {convert(args.input, args.output, args.force)}")

    return run(prog, body)
