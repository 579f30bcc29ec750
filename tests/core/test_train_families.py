"""Llama 3 and Qwen 3 shapes trained with OLMo-core's Trainer on CPU (`configs/olmocore/tiny-llama3-repo.py`,
`tiny-qwen3-repo.py`): two gloo processes from a stage-1 checkpoint (exactly f_phi new), in-loop NIAH at the
start and the end, on data made by `scripts/prepare_data.py` from jsonl text with the model's tokenizer (Llama: a
data folder; Qwen 3: a mix of two sources, OLMo-core's source mixture); the Llama run also killed after a
checkpoint and resumed with the losses of an uninterrupted run (the resume does not depend on the model's family:
the OLMo one is test_train.py's)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from olmo_repo.fit import f_phi_layer
from olmo_repo.olmocore.attention import with_position_modes
from olmo_repo.olmocore.checkpoint import save_model
from olmo_repo.olmocore.train import load_build_config

from ..prepared_data import needs_data_env, prepare_data, write_corpus
from .test_train import _env, _flat, _run
from .training import ROOT, metrics, tiny_options

pytestmark = [pytest.mark.slow, needs_data_env]  # two-process training runs

CONFIGS = ROOT / "configs" / "olmocore"
STEPS = 4
NIAH = ["niah_single_1", "niah_multikey_2"]


def _stage1(config: Path, data: Path, out: Path) -> Path:
    """The config's model with RoPE in every layer, initialised as OLMo-core initialises it, saved model-only
    with the tokenizer it reads (what `scripts/core_convert_from_hf.py` writes for a stock HF model)."""
    experiment = load_build_config(config)(tiny_options(out, data), [])
    model_config = with_position_modes(experiment.model, "rope")
    model = model_config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    tokenizer = experiment.dataset.tokenizer
    recorded = {"identifier": tokenizer.identifier, "vocab_size": tokenizer.vocab_size,
                "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    save_model(model, {"model": model_config.as_config_dict(), "dataset": {"tokenizer": recorded},
                       "train_module": {"max_sequence_length": 512}}, out)  # fmt: skip
    return out


def _command(config: Path, save: Path, data: Path, stage1: Path, launcher: bool = False) -> list[str]:
    start = (
        [sys.executable, str(ROOT / "scripts" / "core_train.py"), "--nproc-per-node=2"]
        if launcher
        else [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node=2", "--standalone",
              str(ROOT / "scripts" / "core_train.py")]
    )  # fmt: skip
    return [
        *start, str(config),
        f"--save-folder={save}", f"--data-root={data}", f"--load_path={stage1}",
        f"--trainer.max_duration.value={STEPS}", "--trainer.callbacks.checkpointer.save_interval=2",
        "--trainer.callbacks.checkpointer.max_checkpoints=10",
        f"--trainer.callbacks.niah.variants={json.dumps(NIAH)}", "--trainer.callbacks.niah.prompts=2",
        f"--trainer.callbacks.niah.eval_interval={STEPS}",
    ]  # fmt: skip


def _prepared(root: Path, family: str) -> Path:
    """The demo's kind of text (~30K tokens) as jsonl, made into a run's data with the demo's tokenizer, the tiny
    models' own: for Llama a data folder, for Qwen 3 a mix of two sources (shares 0.7 and 0.3 of 32K tokens)."""
    import random

    from olmo_repo.experiments.demo import BASE_DIR
    from olmo_repo.experiments.demo.corpus import generate_document

    rng = random.Random(0)
    texts = [" ".join(generate_document(rng) for _ in range(8)) for _ in range(120)]
    write_corpus({root / "text" / f"{i}.jsonl": [{"text": t} for t in texts[i::3]] for i in range(3)})
    model, out = ["--model", str(BASE_DIR), "--workers", "1"], root / "data"
    if family == "llama3":
        prepare_data(*model, "--output", str(out), str(root / "text"))
        return out
    mix = root / "mix.yaml"
    mix.write_text(f"tokens: 32768\nsources:\n  - {{name: a, inputs: ['{root}/text/[01].jsonl'], share: 0.7}}\n"
                   f"  - {{name: b, inputs: ['{root}/text/2.jsonl'], share: 0.3}}\n")  # fmt: skip
    prepare_data(*model, "--mix", str(mix), "--output", str(out))
    return out


@pytest.mark.parametrize("family", [pytest.param("llama3", marks=pytest.mark.long), "qwen3"])
def test_a_run_from_stage1_scores_niah_and_resumes_after_a_kill_as_uninterrupted(family, tmp_path):
    config = CONFIGS / f"tiny-{family}-repo.py"
    data = _prepared(tmp_path, family)
    stage1 = _stage1(config, data, tmp_path / "stage1")
    whole = tmp_path / "whole"
    _run(_command(config, whole, data, stage1), tmp_path / "whole.log")

    # Stage-1 initialisation on two ranks: every base tensor as the checkpoint holds it, f_phi new (RePo layers 1-3).
    start, source = _flat(whole / "step0" / "model_and_optim"), _flat(stage1 / "model_and_optim")
    tensors = {k for k in start if k.startswith("model.")}
    new = {k for k in tensors if k not in source}
    assert new == {k for k in tensors if f_phi_layer(k) is not None}
    assert {f_phi_layer(k) for k in new} == {1, 2, 3}
    for key in tensors & set(source):
        assert torch.equal(start[key], source[key]), key

    # In-loop NIAH at the start and at the end, under the names the OLMo side logs.
    a = metrics(whole)
    for step in (0, STEPS):
        assert {f"eval/{v}/exact_match" for v in NIAH} <= set(a[step]), sorted(a[step])

    assert all(torch.isfinite(torch.tensor(a[step]["train/CE loss"])) for step in range(1, STEPS + 1))
    if family != "llama3":
        return
    # Killed by SIGKILL once the step-2 checkpoint is complete, then the same command again (the launcher's).
    killed, log = tmp_path / "killed", tmp_path / "killed.log"
    command = _command(config, killed, data, stage1, launcher=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 900
        while not (killed / "step2").is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        for process in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            process.send_signal(signal.SIGKILL)
        proc.wait()
    latest = max(int(p.name[4:]) for p in killed.glob("step*") if p.name[4:].isdigit())
    assert 2 <= latest < STEPS, log.read_text()[-3000:]
    _run(command, log)
    assert f"Loading checkpoint from '{killed / f'step{latest}'}'" in log.read_text()
    b = metrics(killed)
    assert sorted(a) == sorted(b) and max(a) == STEPS
    for step in range(1, STEPS + 1):
        assert b[step]["train/CE loss"] == a[step]["train/CE loss"], step
