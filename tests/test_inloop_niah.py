"""The in-loop NIAH evaluator (`olmo_repo.ai2olmo.niah`): its metrics on a model that knows (or misses) the answer,
the one-line refusals of bad entries, sharded = single process under DDP and FSDP (real trainers in gloo
process groups), and a loss trajectory that is bit-identical with and without it.

Run as a script, this file is the worker of the sharding test: `build_trainer` and one `Trainer.eval()`."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # started as torchrun's script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
import torch
from olmo.config import EvaluatorType
from olmo.eval import build_evaluators
from olmo.exceptions import OLMoConfigurationError
from olmo.tokenizer import Tokenizer

from olmo_repo import RepoTrainConfig
from olmo_repo.ai2olmo.niah import NiahEvaluator, build_niah_evaluator, install
from olmo_repo.eval.inloop_rows import RankBatches, Row
from tests.training import (
    ROOT,
    STAGE1,
    TRAIN_SCRIPT,
    cli,
    losses,
    small,
    subprocess_env,
    torchrun_command,
    write_corpus,
)

pytestmark = pytest.mark.slow  # subprocesses, lm-eval prompt building, loopback servers

U32 = 2.0**-24  # unit roundoff of fp32
TOKENIZER = (
    ROOT / "olmo_repo/experiments/demo/base_model/tokenizer.json"
)  # a real BPE (4096 tokens): prompts of ~380
LENGTH = 512
WORKER = Path(__file__).resolve()


def _overrides(data: Path, save: Path, evaluators: str, **extra: object) -> list[str]:
    """The tests' tiny model at LENGTH tokens with the demo tokenizer; `evaluators` as a YAML flow list."""
    values = {
        "model.max_sequence_length": LENGTH,
        "model.vocab_size": 4096,
        "model.embedding_size": 4096,
        "tokenizer.identifier": TOKENIZER,
        "evaluators": evaluators,
        "no_pre_train_checkpoint": "true",
        **extra,
    }
    return small(data, save, **values)


def _entries(*labels: str, **keys: object) -> str:
    extra = "".join(f", {k}: {v}" for k, v in keys.items())
    return "[" + ", ".join(f"{{label: {label}, type: downstream{extra}}}" for label in labels) + "]"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Random ids with the tokenizer the config names beside them (the preflight compares the two)."""
    folder = write_corpus(tmp_path_factory.mktemp("inloop") / "data")
    shutil.copy(TOKENIZER, folder / "tokenizer.json")
    return folder


# ------------------------------------------------------------------------------------- metrics, by hand


def _hand_built_logits(batch: dict, rows, knows: set[int], vocab: int) -> torch.Tensor:
    """A model that reads the answer off the batch: for a prompt in `knows` every gold value token gets logit
    20 (the argmax) and every distractor token -10; otherwise the gold token gets 0 behind a logit of 1 on the
    next token id, and each distractor token 20. Other logits are 0. -> [B, T, V]"""
    ids = batch["input_ids"]  # [B, T]
    logits = torch.zeros(*ids.shape, vocab)
    for b, j in enumerate(batch["niah_row"].tolist()):
        if j < 0:
            continue
        row = rows[j]
        for t in row.scored:
            target = ids[b, t].item()
            if row.sample in knows:
                logits[b, t - 1, target] = 20.0 if row.gold else -10.0
            elif row.gold:
                logits[b, t - 1, (target + 1) % vocab] = 1.0
            else:
                logits[b, t - 1, target] = 20.0
    return logits


def test_batches_read_rows_not_padding_and_are_the_same_on_any_number_of_ranks():
    """Five rows in batches of two: the last batch holds the one row left (a padding row costs a whole read), and
    the rank that has no rows left reads one padding row (-1) so that every rank runs as many forwards."""
    rows = [Row(i, True, [5, 6, 7], [2]) for i in range(5)]

    def batches(rank: int, world: int) -> list[list[int]]:
        return [b["niah_row"].tolist() for b in RankBatches(rows, 2, 8, 0, rank, world)]

    assert batches(0, 1) == [[0, 1], [2, 3], [4]]
    assert batches(0, 2) == [[0, 1], [4]] and batches(1, 2) == [[2, 3], [-1]]
    last = RankBatches(rows, 2, 8, 0, 0, 1)[2]
    assert last["input_ids"].shape == (1, 8) and last["input_ids"][0].tolist() == [5, 6, 7] + [0] * 5


@pytest.mark.parametrize("variant", ["niah_multikey_1", "niah_multivalue", "niah_multikey_3"])
def test_metrics_of_a_model_that_knows_half_the_answers(data, tmp_path, variant):
    cfg = RepoTrainConfig.load(STAGE1, _overrides(data, tmp_path, _entries(variant)))
    tokenizer = Tokenizer.from_train_config(cfg)
    evaluator = build_niah_evaluator(cfg, cfg.evaluators[0], tokenizer, torch.device("cpu"), prompts=4)
    rows = evaluator.eval_loader.dataset.rows
    knows = {0, 2}
    evaluator.reset_metrics()
    for batch in evaluator.eval_loader:
        evaluator.update_metrics(batch, None, _hand_built_logits(batch, rows, knows, 4096))
    metrics = evaluator.compute_metrics()

    V = 4096
    known = 20.0 - math.log(math.exp(20.0) + V - 1)  # log-prob of a known gold token
    missed = 0.0 - math.log(1 + math.e + V - 2)  # of a missed one
    expected = {
        f"eval/{variant}/exact_match": 0.5,
        f"eval/{variant}/logprob": (2 * known + 2 * missed) / 4,
    }
    if variant.startswith("niah_multikey"):
        expected[f"eval/{variant}/rank_acc"] = 0.5
        per_prompt = [sum(not r.gold and r.sample == i for r in rows) for i in range(4)]
        # niah_multikey_1: its three distractor needles; niah_multikey_3: as many UUID needles as fit 512 tokens
        assert (
            per_prompt == [3] * 4
            if variant == "niah_multikey_1"
            else 1 <= min(per_prompt) <= max(per_prompt) <= 3
        )
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        # log_softmax in fp32: a few roundoffs of logsumexp (~log V + 20)
        assert metrics[key] == pytest.approx(value, abs=16 * U32 * 30), key
    # the answer's value tokens are scored, its separators are context only
    gold = next(r for r in rows if r.gold)
    for t in range(gold.scored[0], len(gold.tokens)):
        piece = tokenizer.decode([gold.tokens[t]])
        assert bool(re.fullmatch(r"[ ,]*[0-9a-f-]+", piece)) == (t in gold.scored), (t, piece)


# ------------------------------------------------------------------------------------------- refusals


def _lm(data: Path) -> str:
    """A stock entry: perplexity on val.npy."""
    return f"{{label: val, type: lm, data: {{paths: ['{data}/val.npy'], memmap_dtype: uint32}}}}"


@pytest.mark.parametrize(
    "entry, key, says",
    [
        (
            "{label: niah_single_9, type: downstream}",
            "evaluators[1].label",
            "unknown NIAH variant 'niah_single_9'",
        ),
        (
            "{label: niah_single_1@1024, type: downstream}",
            "evaluators[1].label",
            "model.max_sequence_length (512)",
        ),
        ("{label: niah_single_1@200, type: downstream}", "evaluators[1].label", "tokenizer.identifier"),
        ("{label: niah_single_1@x, type: downstream}", "evaluators[1].label", "positive integer"),
        ("{label: niah_single_1}", "evaluators[1].type", "type: downstream"),
        (
            "{label: niah_single_1, type: downstream, subset_num_batches: 2}",
            "evaluators[1].subset_num_batches",
            "",
        ),
        ("{label: niah_single_1, type: downstream, prompts: 0}", "evaluators[1].prompts=0", "at least one"),
    ],
)
def test_a_bad_entry_is_refused_with_one_line_naming_the_key(data, tmp_path, entry, key, says):
    install()
    evaluators = f"[{_lm(data)}, {entry}]"
    cfg = RepoTrainConfig.load(STAGE1, _overrides(data, tmp_path, evaluators))
    with pytest.raises(OLMoConfigurationError) as e:
        build_evaluators(cfg, torch.device("cpu"))
    message = str(e.value)
    assert message.startswith(f"{key}: ") and says in message and "\n" not in message


def test_the_train_command_refuses_a_bad_entry_before_training(data, tmp_path):
    save = tmp_path / "run"
    cmd = [sys.executable, str(TRAIN_SCRIPT), str(STAGE1)]
    cmd += cli(_overrides(data, save, _entries("niah_multikey_9")))
    result = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "evaluators[0].label" in line]
    assert len(lines) == 1 and "unknown NIAH variant 'niah_multikey_9'" in lines[0], result.stderr[-3000:]
    assert not (save / "config.yaml").exists() and not (save / "metrics.jsonl").exists()


def test_the_launchers_check_refuses_a_length_too_short_as_the_workers_build_would(data, tmp_path):
    """`scripts/train.py --check` (and `--nproc-per-node`, before any worker starts) builds one prompt per entry:
    a haystack that does not fit is refused there, in the words each worker's build uses."""
    from olmo_repo.ai2olmo.train import check

    overrides = _overrides(data, tmp_path / "run", _entries("niah_single_1@200"))
    with pytest.raises(OLMoConfigurationError) as checked:
        check(str(STAGE1), overrides, world_size=1, local_world_size=1)
    install()
    with pytest.raises(OLMoConfigurationError) as built:
        build_evaluators(RepoTrainConfig.load(STAGE1, overrides), torch.device("cpu"))
    assert str(checked.value) == str(built.value)
    assert "evaluators[0].label: 'niah_single_1@200'" in str(
        checked.value
    ) and "length 200 is too short" in str(checked.value)
    assert not (tmp_path / "run").exists()


def test_prompts_sets_the_prompt_count_of_niah_entries_only(data, tmp_path):
    install()
    entries = f"[{_lm(data)}, {{label: niah_multikey_1, type: downstream, prompts: 3}}]"
    cfg = RepoTrainConfig.load(STAGE1, _overrides(data, tmp_path, entries))
    _, niah_evaluator = build_evaluators(cfg, torch.device("cpu"))
    assert isinstance(niah_evaluator, NiahEvaluator) and niah_evaluator.eval_metric.gold.numel() == 3
    stock_with_prompts = _lm(data).replace("type: lm,", "type: lm, prompts: 3,")
    cfg = RepoTrainConfig.load(STAGE1, _overrides(data, tmp_path, f"[{stock_with_prompts}]"))
    with pytest.raises(OLMoConfigurationError, match=r"^evaluators\[0\]\.prompts: only NIAH evaluators"):
        build_evaluators(cfg, torch.device("cpu"))


def test_other_entries_build_as_stock(data, tmp_path):
    install()
    cfg = RepoTrainConfig.load(STAGE1, _overrides(data, tmp_path, f"[{_lm(data)}]"))
    (evaluator,) = build_evaluators(cfg, torch.device("cpu"))
    assert type(evaluator) is not NiahEvaluator and evaluator.type == EvaluatorType.lm


# ------------------------------------------------------------------------------------------- sharding

SHARDED = ("niah_single_1", "niah_multikey_1", "niah_multivalue")


def _eval_metrics(cmd: list[str], save: Path) -> dict[str, float]:
    result = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0]  # one record: the evaluators' calls at step 0 merged
    return {k: v for k, v in records[0].items() if k.startswith("eval/")}


@pytest.mark.long
def test_sharded_over_ranks_equals_one_process_under_ddp_and_fsdp(data, tmp_path):
    results = {}
    for name, nproc, strategy in [("single", 1, "ddp"), ("ddp", 2, "ddp"), ("fsdp", 2, "fsdp")]:
        save = tmp_path / name
        args = [str(STAGE1), *cli(_overrides(data, save, _entries(*SHARDED), distributed_strategy=strategy))]
        cmd = torchrun_command(WORKER, args, nproc) if nproc > 1 else [sys.executable, str(WORKER), *args]
        results[name] = _eval_metrics(cmd, save)
    single = results["single"]
    assert len(single) == 7 and {f"eval/{v}/logprob" for v in SHARDED} <= single.keys()
    assert all(math.isfinite(v) for v in single.values())
    # each row is read on one rank, in the same batches as in one process (OMP_NUM_THREADS=1): bit-identical
    assert results["ddp"] == single
    assert results["fsdp"] == single


# ------------------------------------------------------------------------------------------- trajectory


def test_the_loss_trajectory_is_bit_identical_with_and_without_it(data, tmp_path):
    runs = {}
    for name, evaluators in [
        ("without", "[]"),
        ("with", _entries("niah_multikey_1", device_eval_batch_size=8, prompts=4)),
    ]:
        save = tmp_path / name
        steps = dict(max_duration=4, stop_at=4, eval_interval=1, save_interval_unsharded=1000)
        cmd = [
            sys.executable,
            str(TRAIN_SCRIPT),
            str(STAGE1),
            *cli(_overrides(data, save, evaluators, **steps)),
        ]
        result = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[name] = (save, result.stdout + result.stderr)
    assert losses(runs["with"][0]) == losses(runs["without"][0]) and len(losses(runs["with"][0])) == 4
    records = [json.loads(line) for line in (runs["with"][0] / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in records if "eval/niah_multikey_1/exact_match" in r}
    assert sorted(evals) == [1, 2, 3, 4]
    assert all({"logprob", "rank_acc"} <= {k.split("/")[-1] for k in r} for r in evals.values())
    assert "eval/niah_multikey_1/logprob=" in runs["with"][1]  # the console, OLMo's format


@pytest.mark.slow
def test_eval_on_load_scores_a_checkpoint_loaded_at_step_0(data, tmp_path):
    """A continual pre-training from a checkpoint at step 0 (a converted model) with `eval_on_load`: the first
    records of metrics.jsonl are the evaluators' at step 0, before any training step (stock OLMo: none)."""

    def train(save: Path, **extra: object) -> list[dict]:
        overrides = _overrides(
            data, save, _entries("niah_single_1", prompts=2), max_duration=1, stop_at=1, **extra
        )
        cmd = [sys.executable, str(TRAIN_SCRIPT), str(STAGE1), *cli(overrides)]
        result = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]

    first = train(tmp_path / "first", no_pre_train_checkpoint="false", eval_interval=1000)
    assert not any(r["step"] == 0 and "eval/niah_single_1/exact_match" in r for r in first)  # nothing loaded
    records = train(
        tmp_path / "second",
        load_path=tmp_path / "first/step0-unsharded",
        eval_on_load="true",
        eval_interval=1000,
    )
    assert "eval/niah_single_1/exact_match" in records[0] and records[0]["step"] == 0
    assert [r["step"] for r in records if "train/CrossEntropyLoss" in r] == [1]


# ------------------------------------------------------------------------------------------- worker


def _worker(argv: list[str]) -> None:
    """The train command's steps up to `fit()`, then one `Trainer.eval()` (metrics.jsonl on rank 0)."""
    import torch.distributed as dist
    from olmo.torch_util import barrier
    from olmo.util import clean_opt

    from olmo_repo.ai2olmo.preflight import preflight
    from olmo_repo.ai2olmo.train import build_trainer, init_distributed
    from olmo_repo.upstream.torch import patch_torch_for_olmo

    patch_torch_for_olmo()
    device = init_distributed()
    install(prompts=5)
    cfg = RepoTrainConfig.load(argv[0], [clean_opt(a) for a in argv[1:]])
    preflight(cfg, cuda=False, world_size=dist.get_world_size())
    with build_trainer(cfg, device) as trainer:
        trainer.eval()
    del trainer  # as the train command does: the trainer (its DDP reducer holds the group) goes first,
    barrier()  # then every rank's collectives finish; a group torn down under a gloo thread still freeing
    dist.destroy_process_group()  # the last all-gather's tensors deadlocks on the GIL (torch 2.13)


if __name__ == "__main__":
    _worker(sys.argv[1:])
