"""The study's from-scratch part: every (arm, seed) of `retrieval` trained and tested as a stage of the study's
folder, two at a time (one core each), and its table."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from typing import Any

from ...tables import markdown_table
from ..stages import Stages, digest
from .task import ARMS, TinyModel

__all__ = ["TESTS", "run_scratch", "scratch_results", "scratch_section"]

TESTS = {  # name -> (length factor, YaRN factor)
    "1x": (1, 1),
    "4x": (4, 1),
    "4x, YaRN": (4, 4),
}
"""Where each model is tested: at the training length, at 4x as trained, and at 4x with YaRN (factor 4 from the
training length) in its RoPE layers and RePo's rotation (NoPE has no rotation to scale: the same as 4x)."""
TEST_SEQUENCES = 200  # per test, of 8 queries each
TEST_SEED = 10_000  # test sequences are drawn apart from every training seed


def _one(arm: str, seed: int, shape: TinyModel, sequences: int) -> dict[str, Any]:
    """Train and test one model (in a worker process, one thread)."""
    import torch

    from ...positions import spread
    from ...rope import record_positions
    from .retrieval import accuracy, build, train

    torch.set_num_threads(1)
    model, facts = train(arm, shape, seed)
    result: dict[str, Any] = {**facts}
    for test, (factor, yarn) in TESTS.items():
        task = shape.task.scaled(factor)
        scaled = build(arm, shape, seed, yarn=yarn).eval() if yarn > 1 else model
        if scaled is not model:
            scaled.load_state_dict(model.state_dict())
        result[test] = accuracy(scaled, task, sequences, TEST_SEED)
    if arm == "RePo":  # what its positions look like on test sequences at the training length
        ids, _, _ = shape.task.batch(torch.Generator().manual_seed(TEST_SEED), 50)
        with torch.no_grad(), record_positions(model) as positions:
            model(ids)
        result["positions"] = {str(layer): spread(z) for layer, z in sorted(positions.items())}
    return result


def run_scratch(
    folder: Stages,
    shape: TinyModel,
    seeds: Sequence[int],
    workers: int = 2,
    sequences: int = TEST_SEQUENCES,
) -> dict[str, Any]:
    """Each (arm, seed) as a stage `scratch-{arm}-{seed}` of `folder` (done ones kept), `workers` at a time, each
    tested on `sequences` sequences; returns {"{arm}-{seed}": result}."""
    inputs = _inputs(shape, sequences)
    jobs = [(arm, seed) for seed in seeds for arm in ARMS]
    todo = [(arm, seed) for arm, seed in jobs if folder.state(f"scratch-{arm}-{seed}", inputs, []) != "done"]
    if todo:
        print(
            f"\n== from scratch: {len(todo)} of {len(jobs)} models to train, {workers} at a time", flush=True
        )
        context = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked torch state
        env = {"OMP_NUM_THREADS": "1"}
        os.environ.update(env)
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = {pool.submit(_one, arm, seed, shape, sequences): (arm, seed) for arm, seed in todo}
            for future in as_completed(futures):
                arm, seed = futures[future]
                result = future.result()
                folder.finish(f"scratch-{arm}-{seed}", result=json.dumps(result))
                scores = ", ".join(f"{t} {r[0] / r[1]:.2f}" for t, r in result.items() if t in TESTS)
                print(
                    f"   {arm}, seed {seed}: {result['wall_s'] / 60:.1f} min, accuracy {scores}", flush=True
                )
    results = scratch_results(folder, shape, seeds, sequences)
    assert results is not None  # every stage finished above
    return results


def scratch_results(
    folder: Stages, shape: TinyModel, seeds: Sequence[int], sequences: int = TEST_SEQUENCES
) -> dict[str, Any] | None:
    """What `run_scratch` returns, read from the folder's records alone: None unless every (arm, seed) finished
    with these inputs."""
    inputs, results = _inputs(shape, sequences), {}
    for arm, seed in [(arm, seed) for seed in seeds for arm in ARMS]:
        record = folder.record(f"scratch-{arm}-{seed}")
        if record is None or record["inputs"] != inputs or not record["done"]:
            return None
        results[f"{arm}-{seed}"] = json.loads(record["result"])
    return results


def _inputs(shape: TinyModel, sequences: int) -> str:
    return digest(json.dumps(asdict(shape)), json.dumps(TESTS), str(sequences), str(TEST_SEED))


def scratch_section(
    results: dict[str, Any], shape: TinyModel, seeds: Sequence[int], sequences: int = TEST_SEQUENCES
) -> str:
    """The Markdown section: accuracy per arm and test (pooled over seeds, with its Wilson 95% interval, and
    per seed), the RePo models' positions, and the setup."""
    from ...eval.intervals import wilson_interval

    rows = []
    for arm in ARMS:
        cells = []
        for test in TESTS:
            counts = [results[f"{arm}-{seed}"][test] for seed in seeds]
            right, scored = sum(c[0] for c in counts), sum(c[1] for c in counts)
            low, high = wilson_interval(right / scored, scored)
            per_seed = " / ".join(f"{100 * c[0] / c[1]:.0f}" for c in counts)
            cells.append(f"{100 * right / scored:.1f} [{100 * low:.1f}, {100 * high:.1f}] ({per_seed})")
        loss = sum(results[f"{arm}-{seed}"]["loss"] for seed in seeds) / len(seeds)
        minutes = max(results[f"{arm}-{seed}"]["wall_s"] for seed in seeds) / 60
        rows.append([arm, *cells, f"{loss:.3f}", f"{minutes:.1f}"])
    t = shape.task
    table = markdown_table(
        [
            "model",
            *(f"accuracy % at {name}" for name in TESTS),
            "answers' train loss, last 100 steps",
            "min (slowest seed)",
        ],
        rows,
    )
    positions = []
    for seed in seeds:
        for layer, stats in results[f"RePo-{seed}"].get("positions", {}).items():
            positions.append([f"seed {seed}, layer {layer}", f"{stats['std']:.2f}",
                              f"[{stats['p05']:.2f}, {stats['p95']:.2f}]", f"{stats['rank_corr']:+.2f}"])  # fmt: skip
    return (
        "## From scratch: recall among distractors at 1x and 4x the training length\n\n"
        f"{shape.layers}-layer models (d={shape.hidden}, {shape.heads} heads), trained from scratch for "
        f"{shape.steps} steps of {shape.batch} sequences of {t.length} tokens, each holding {t.pairs} key-value "
        f"pairs among noise (a grammar makes {t.rule:.0%} of the noise follow from the token two back) and "
        f"{t.queries} queries, trained on the answers and the noise; tested on {sequences} new sequences per cell: at "
        f"{t.length} tokens, and at {4 * t.length} with {4 * t.pairs} pairs, without and with YaRN (factor 4). "
        f"RePo from layer {shape.layers // 3} (RoPE below), as the paper's 1B. Seeds {', '.join(map(str, seeds))}; "
        "each cell pools the seeds' answers (Wilson 95% interval over the test answers, not over seeds; per "
        "seed in brackets). A model that "
        f"guesses among the context's values scores 1 in {t.pairs} at the training length and 1 in {4 * t.pairs} "
        "at 4x.\n\n"
        + table
        + "\n\nRePo's positions on test sequences at the training length (per layer: std, 5th-95th percentile, "
        "Spearman's rank correlation with the token index):\n\n"
        + markdown_table(["RePo model", "std", "p05, p95", "rank corr"], positions)
        + "\n"
    )
