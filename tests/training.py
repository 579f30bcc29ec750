"""Helpers for the training tests: a tiny random-token corpus, overrides that shrink the tiny configs, and an
in-process trainer."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

ROOT = Path(__file__).resolve().parents[1]
STAGE1 = ROOT / "olmo_repo/experiments/demo/configs/tiny-stage1-rope.yaml"
STAGE2_REPO = ROOT / "olmo_repo/experiments/demo/configs/tiny-stage2-repo.yaml"
TRAIN_SCRIPT = ROOT / "scripts/train.py"
VOCAB = 128


def write_corpus(data_dir: Path, n_tokens: int = 12_000) -> Path:
    """stage1.npy, stage2.npy and val.npy of random token ids (uint32 memmaps, as OLMo reads them), and a
    word-level tokenizer.json of the same vocabulary size (OLMo checks the config's vocab against it)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    Tokenizer(WordLevel(vocab, unk_token="t2")).save(str(data_dir / "tokenizer.json"))
    rng = np.random.default_rng(0)
    for split in ("stage1", "stage2", "val"):
        rng.integers(2, VOCAB, n_tokens, dtype=np.uint32).tofile(data_dir / f"{split}.npy")
    return data_dir


def truncate(path: Path) -> None:
    """Cut a file to half its size (a copy or upload that stopped midway)."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DOCUMENTED = ["README.md", "docs/**/*.md"]  # where a user reads commands
SHELL_FENCES = ("sh", "bash", "shell", "console")


def documented_pages() -> list[Path]:
    """README.md and every page of the documentation site."""
    return [page for pattern in DOCUMENTED for page in sorted(ROOT.glob(pattern))]


def _shell_lines(text: str) -> Iterator[str]:
    """The lines of ```sh (bash, shell, console) fences and of indented code blocks outside fences, stripped."""
    fence, indented, after_blank = None, False, True  # fence: the open fence's language, None outside fences
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().split(" ")[0]
        elif fence is not None:
            if fence in SHELL_FENCES:
                yield stripped
        else:  # an indented code block starts after a blank line; blank lines inside it keep it open
            indented = line.startswith("    ") and (indented or after_blank) if stripped else indented
            after_blank = not stripped
            if indented:
                yield stripped


def documented_commands() -> list[str]:
    """The shell commands of README.md and the docs pages, continuation lines joined, comments dropped."""
    commands, current = [], ""
    for page in documented_pages():
        for line in _shell_lines(page.read_text()):
            if not line or line.startswith("#"):
                continue
            current += line.removesuffix("\\")
            if not line.endswith("\\"):
                commands.append(current.split("  #")[0].strip())
                current = ""
    return commands


def small(data_dir: Path, save_folder: Path, **extra: object) -> list[str]:
    """`key=value` overrides: a 3-layer d=32 model on a 128-token vocabulary, 4 x 32 tokens per step."""
    values: dict[str, object] = {
        "data_prefix": data_dir,
        "save_folder": save_folder,
        "model.d_model": 32,
        "model.n_layers": 3,
        "model.mlp_ratio": 4,
        "model.max_sequence_length": 32,
        "model.vocab_size": VOCAB,
        "model.embedding_size": VOCAB,
        "model.eos_token_id": 0,
        "model.pad_token_id": 1,
        "global_train_batch_size": 4,
        "device_train_microbatch_size": 2,
        "device_eval_batch_size": 4,
        "tokenizer.identifier": data_dir / "tokenizer.json",
        "evaluators": "[]",
        **extra,
    }
    return [f"{k}={v}" for k, v in values.items()]


def make_trainer(config: Path, overrides: list[str], device):
    """`scripts/train.py`'s steps up to `fit()`, in this process (its one-process gloo group)."""
    from olmo_repo import RepoTrainConfig
    from olmo_repo.ai2olmo.preflight import preflight
    from olmo_repo.ai2olmo.train import build_trainer

    cfg = RepoTrainConfig.load(config, overrides)
    preflight(cfg, cuda=False, world_size=1)
    return build_trainer(cfg, device)


def cli(overrides: list[str]) -> list[str]:
    return [f"--{o}" for o in overrides]


def train_command(config: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, str(TRAIN_SCRIPT), str(config), *cli(overrides)]


def subprocess_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OLMo_NONINTERACTIVE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def losses(save_folder: Path) -> dict[int, float]:
    """{step: training loss} from save_folder/metrics.jsonl, where every step is logged once (also after resumes)."""
    records = [json.loads(line) for line in (save_folder / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["train/CrossEntropyLoss"]) for r in records if "train/CrossEntropyLoss" in r]
    assert len({step for step, _ in losses}) == len(losses), "a step is logged twice"
    return dict(losses)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(script: Path, args: list[str], nproc: int = 2) -> list[str]:
    """`torchrun --nproc_per_node=nproc script args` on a free loopback port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_port",
        str(free_port()),
        str(script),
        *args,
    ]


def holder(lock: Path, launcher: subprocess.Popen, timeout: float = 300) -> psutil.Process:
    """The training process of `launcher` that holds the save folder of `lock` (its `olmo_repo.ownership` lock
    file, naming it), once it does."""
    deadline = time.monotonic() + timeout
    while launcher.poll() is None and time.monotonic() < deadline:
        try:
            pid = json.loads(lock.read_text() or "null")["pid"]
        except (OSError, TypeError, ValueError):
            time.sleep(0.1)
            continue
        worker = psutil.Process(pid)
        assert worker in psutil.Process(launcher.pid).children(recursive=True) and pid != launcher.pid
        return worker
    raise AssertionError(f"no training process of {launcher.args} holds {lock.parent}")


def stop_with_sigusr1(cmd: list[str], save_folder: Path) -> tuple[int, str]:
    """Run `cmd` (one process), send it SIGUSR1 once it has logged a training step, and wait for it to stop.

    Returns the step its stop message names and its output; asserts that it exited cleanly.
    """
    log_path = save_folder.parent / f"{save_folder.name}-stopped.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not (save_folder / "metrics.jsonl").is_file() and proc.poll() is None:
            assert time.monotonic() < deadline, "no training step logged"
            time.sleep(0.005)
        proc.send_signal(signal.SIGUSR1)  # training has started, so the handler is in place
        code = proc.wait(timeout=300)
    output = log_path.read_text()
    assert code == 0, output[-4000:]
    (step,) = map(int, re.findall(r"SIGUSR1: saving a checkpoint at step (\d+) and stopping", output))
    return step, output
