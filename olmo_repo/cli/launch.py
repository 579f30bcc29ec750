"""How the training commands start a multi-process run: check once, then start the workers with torchrun.

Under a plain `torchrun --nproc-per-node=N scripts/train.py ...` every worker reads the config itself, so a bad
input is said once per rank and followed by torchrun's own traceback (`ChildFailedError`). The training commands
take `--nproc-per-node=N` instead: they run the checks that each rank would run before training (config, data,
checkpoints, save folder) once, here, then start N workers on this machine through torchrun (`--standalone`)
with the same arguments, each running the command's module. `--check` runs the checks alone, for a run of
`--nnodes` x `--nproc-per-node` processes (what `scripts/slurm/` does before it starts a job's nodes).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import command
from ..ownership import LAUNCHER_PID
from . import fail, positive_int, run

__all__ = ["add_arguments", "config_kind_problem", "launched", "worker_args"]

_VALUE_FLAGS = ("--nproc-per-node", "--nnodes")  # the launch flags that take a value; --check takes none


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--nproc-per-node`, `--nnodes` and `--check` of a training command."""
    group = parser.add_argument_group("starting the run")
    group.add_argument(
        "--nproc-per-node",
        type=positive_int,
        default=None,
        metavar="N",
        help="check the run once, then start N training processes on this machine with torchrun (--standalone); "
        "without it the command trains in one process, or is one worker of a torchrun you started",
    )
    group.add_argument(
        "--nnodes",
        type=positive_int,
        default=1,
        metavar="M",
        help="with --check: the run has M nodes of --nproc-per-node processes (default 1)",
    )
    group.add_argument(
        "--check",
        action="store_true",
        help="check the config, data, checkpoints and save folder for the run, start nothing, exit 0 if it can "
        "train (scripts/slurm/ runs this before a job's nodes start)",
    )


_CONFIG_KINDS = {  # trainer -> (its config files' suffixes, what they are, the command that trains them)
    "ai2-olmo": ((".yaml", ".yml"), "an ai2-olmo config (YAML, configs/*.yaml)", "train"),
    "olmo-core": ((".py",), "an OLMo-core config (Python, configs/olmocore/*.py)", "core_train"),
}


def config_kind_problem(config: str, trainer: str) -> str | None:
    """The one line for a config file of the other trainer given to `trainer`'s command (each would fail on the
    other's file with a parser's or an import's traceback): which trainer it is for, and its command."""
    suffixes, what, _ = _CONFIG_KINDS[trainer]
    if Path(config).suffix in suffixes:
        return None
    other = next(t for t in _CONFIG_KINDS if t != trainer)
    if Path(config).suffix not in _CONFIG_KINDS[other][0]:
        return f"{config} is not {what}"
    return f"{config} is {_CONFIG_KINDS[other][1]}: train it with {command(_CONFIG_KINDS[other][2])}"


def worker_args(argv: list[str]) -> list[str]:
    """The command's arguments without the launch flags: what each worker gets."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _VALUE_FLAGS:
            skip = True
        elif arg != "--check" and not arg.startswith(tuple(f"{flag}=" for flag in _VALUE_FLAGS)):
            out.append(arg)
    return out


def launched(
    parser: argparse.ArgumentParser,
    opts: argparse.Namespace,
    argv: list[str],
    module: str,
    check: Callable[[int, int], None],
    errors: Callable[[], tuple[type[BaseException], ...]],
) -> int | None:
    """The exit status when `opts` asks to check or start the run (`check(world_size, local_world_size)` raises
    one of `errors()` for an input the run would refuse); None to train in this process."""
    if opts.nnodes != 1 and not opts.check:
        parser.error(
            "--nnodes is for --check: a multi-node run starts one torchrun per node (scripts/slurm/)"
        )
    if opts.nproc_per_node is None and not opts.check:
        return None
    nproc = opts.nproc_per_node or 1
    status = run(parser.prog, lambda: check(nproc * opts.nnodes, nproc), errors)
    if status or opts.check:
        if not status:
            print(f"{parser.prog}: the run can start on {opts.nnodes} node(s) x {nproc} process(es)")
        return status
    return _torchrun(parser.prog, module, nproc, worker_args(argv))


def _torchrun(prog: str, module: str, nproc: int, args: list[str]) -> int:
    """torchrun, in this process: `nproc` workers of `python -m module args`; a failed worker is one line."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    os.environ[LAUNCHER_PID] = str(os.getpid())  # the workers die with this process (olmo_repo.ownership)
    try:
        torchrun(parse_args(["--standalone", f"--nproc-per-node={nproc}", "-m", module, *args]))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        return fail(
            prog, f"training process {rank} failed (exit status {failure.exitcode}): its error is above"
        )
    except SignalException as e:  # torchrun stopped its workers on SIGTERM/SIGINT
        print(f"{prog}: stopped by {signal.Signals(e.sigval).name}", file=sys.stderr)
        return 128 + e.sigval
    return 0
