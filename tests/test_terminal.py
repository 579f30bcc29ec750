"""Losing the terminal ends the printing, never the work (`olmo_repo.terminal`, which every command's process and
every torchrun worker installs through `olmo_repo.cli.command`; tests/test_scripts.py checks that every command's
`main` is one): a closed pipe (`| head`) or a full disk under the output, a logging handler made before, a child
process started after. Real commands are checked where their runs are: the training commands in
tests/test_train_cli.py and tests/core/test_train.py (two torchrun workers), prepare_data.py in
tests/test_prepare_data.py (`2>&1 | head -1` made eval.py, core_convert_to_hf.py and prepare_data.py exit 1, eval.py
with nothing saved)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from olmo_repo.cli import flops
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.terminal import QuietStream

from .dead_terminal import run_to_head

ROOT = Path(__file__).resolve().parents[1]

# Writes more than a pipe holds (64 KiB) through a logging handler made before the streams were wrapped, then through
# print and stderr, then starts a child that prints, then writes its product: the file argv[1].
_WORK = """
import logging, subprocess, sys
logging.basicConfig(stream=sys.stdout, format="%(message)s")
from olmo_repo.terminal import keep_working_without_terminal
keep_working_without_terminal()
for i in range(20_000):
    logging.warning("line %d", i)
for i in range(20_000):
    print("line", i)
    sys.stderr.write("err\\n")
subprocess.run([sys.executable, "-c", "print('child ' * 100_000)"], check=True)
open(sys.argv[1], "w").write("done")
"""


def _work(product: Path) -> list[str]:
    return [sys.executable, "-c", _WORK, str(product)]


def test_a_closed_pipe_ends_the_printing_not_the_work(tmp_path):
    status, lines = run_to_head(_work(tmp_path / "product"), cwd=ROOT)
    assert (status, lines, (tmp_path / "product").read_text()) == (0, ["line 0\n"], "done")


def test_a_closed_standard_output_is_not_reported_on_standard_error(tmp_path):
    """`| head -1` with stderr to a log: nothing of logging's `--- Logging error ---` there, only the work's own."""
    log = tmp_path / "err.log"
    status, _ = run_to_head(_work(tmp_path / "product"), log=log, cwd=ROOT)
    assert status == 0 and (tmp_path / "product").read_text() == "done"
    assert set(log.read_text().splitlines()) == {"err"}


def test_a_full_disk_under_the_output_ends_the_printing_not_the_work(tmp_path):
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        done = subprocess.run(_work(tmp_path / "product"), stdout=full, stderr=full, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and (tmp_path / "product").read_text() == "done"


def test_a_quiet_stream_points_its_descriptor_at_the_null_device():
    """Once a write failed, what else writes to the descriptor (C code, a child) goes quiet too, as later writes."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w") as pipe:
        stream = QuietStream(pipe)
        stream.write("x" * 100_000)  # more than the buffer: written through to the closed pipe
        stream.flush()
        assert stream.lost and os.write(write, b"quiet") == 5
        assert stream.write("more") == 4


def test_a_command_whose_product_is_its_printout_fails_without_it(monkeypatch, capsys):
    """flops.py's table is its product: with standard output on a full disk it exits 1, saying so on stderr."""
    with open("/dev/full", "w") as disk:
        full = QuietStream(disk)
        monkeypatch.setattr(sys, "stdout", full)
        assert flops.main([str(BASE_DIR)]) == 1 and full.lost
    assert (
        capsys.readouterr().err == "flops.py: error: standard output was closed before the table was whole\n"
    )
