"""The study's from-scratch part: each (arm, seed) of `task.ARMS` trained and tested (`retrieval`) as a stage of
the study's folder, two at a time (one core each), and its section of the report.

What the section decides with: which models learned (`task.LEARNED` at the training length, fixed before the
runs), each arm's learned share over its seeds with its Wilson interval, the one-sided Fisher exact test of an arm
against the one it is compared with and the smallest difference those seed counts detect; then, among the
models that learned, each test's accuracy (mean and t interval over seeds, and each seed's).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from ...tables import markdown_table
from ..stages import Stages, digest
from .task import ARMS, LEARNED, TESTS, Arm, TinyModel

__all__ = [
    "CURVES",
    "FIGURE",
    "TEST_SEQUENCES",
    "jobs",
    "learned_counts",
    "loss_curves",
    "run_scratch",
    "scratch_results",
    "scratch_section",
]

Runs = dict[str, list[tuple[int, dict[str, Any]]]]  # {arm key: [(seed, result)]}
TEST_SEQUENCES = 200  # per test, of 8 queries each
FIGURE = "scratch-learned.png"  # the learned shares, beside the study's report.md
CURVES = "scratch-curves.png"  # every model's answers' loss against the step
FELL = 0.1  # the answers' training loss under which the recall counts as found (the guess's is ln 4 = 1.39)
TEST_SEED = 10_000  # test sequences are drawn apart from every training seed, the same for every model


def jobs(seeds: int, arms: Sequence[Arm] = ARMS) -> list[tuple[Arm, int]]:
    """Every (arm, seed) of a study of `seeds` seeds, seed by seed: a study cut short holds whole seeds."""
    return [(arm, seed) for seed in range(seeds) for arm in arms if seed < arm.seed_count(seeds)]


def _worker_start() -> None:
    """A worker's start. A terminal's Ctrl-C reaches the whole process group, and only the parent acts on it (it
    terminates the workers), so a worker does not die mid-model printing a traceback of its own. A parent killed
    outright (SIGKILL, OOM) terminates nothing: the worker ends itself within a second of being orphaned, rather
    than training on for minutes beside a resumed run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _job(job: tuple[Arm, int, TinyModel, int]) -> tuple[Arm, int, dict[str, Any]]:
    arm, seed, shape, sequences = job
    return arm, seed, _one(arm, seed, shape, sequences)


def _one(arm: Arm, seed: int, shape: TinyModel, sequences: int) -> dict[str, Any]:
    """Train and test one model (in a worker process, one thread)."""
    import torch

    from ...positions import spread
    from ...rope import record_positions
    from .retrieval import accuracy, build, train

    torch.set_num_threads(1)
    model, facts = train(arm, shape, seed)
    result: dict[str, Any] = {**facts}
    for test, (length, pairs, yarn) in TESTS.items():
        scaled = build(arm, shape, seed, yarn=yarn).eval() if yarn > 1 else model
        if scaled is not model:
            scaled.load_state_dict(model.state_dict())
        result[test] = accuracy(scaled, shape.task.scaled(length, pairs), sequences, TEST_SEED)
    if arm.mode == "repo":  # what its positions look like on test sequences at the training length
        ids, _, _ = shape.task.batch(torch.Generator().manual_seed(TEST_SEED), 50)
        with torch.no_grad(), record_positions(model) as positions:
            model(ids)
        result["positions"] = {str(layer): spread(z) for layer, z in sorted(positions.items())}
    # when and on what load it finished: a study spans sessions, and a time is a measurement of its machine
    result["finished"], result["load"] = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    return result


def run_scratch(
    folder: Stages,
    shape: TinyModel,
    seeds: int,
    workers: int = 2,
    sequences: int = TEST_SEQUENCES,
    after: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """Each (arm, seed) of `jobs(seeds)` as a stage `scratch-{arm.key}-{seed}` of `folder` (done ones kept),
    `workers` at a time, each tested on `sequences` sequences per test, `after()` called as each is recorded (the
    study's report: a long run shows what it has so far); returns {"{arm.key}-{seed}": result}."""
    every = jobs(seeds)
    todo = [
        (arm, seed)
        for arm, seed in every
        if folder.state(f"scratch-{arm.key}-{seed}", _inputs(shape, sequences, arm), []) != "done"
    ]
    if todo:
        print(
            f"\n== from scratch: {len(todo)} of {len(every)} models to train, {workers} at a time", flush=True
        )
        context = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked torch state
        os.environ.update({"OMP_NUM_THREADS": "1"})
        done = len(every) - len(todo)
        # Leaving the pool's block terminates its workers: a Ctrl-C or a failed model ends the part at once,
        # losing only the models under way (concurrent.futures' pool would wait for every queued model first).
        with context.Pool(workers, initializer=_worker_start) as pool:
            for arm, seed, result in pool.imap_unordered(
                _job, [(arm, seed, shape, sequences) for arm, seed in todo]
            ):
                folder.finish(f"scratch-{arm.key}-{seed}", result=json.dumps(result))
                done += 1
                first = result["1x"]
                print(
                    f"   [{done}/{len(every)}] {arm.label}, seed {seed}: {result['wall_s'] / 60:.1f} min, "
                    f"{100 * first[0] / first[1]:.1f}% at the training length",
                    flush=True,
                )
                if after is not None:
                    after()
    results = scratch_results(folder, shape, seeds, sequences)
    assert results is not None  # every stage finished above
    return results


def scratch_results(
    folder: Stages, shape: TinyModel, seeds: int, sequences: int = TEST_SEQUENCES, partial: bool = False
) -> dict[str, Any] | None:
    """What `run_scratch` returns, read from the folder's records alone: None unless every (arm, seed) finished
    with these inputs (`partial`: those that did, None if none did)."""
    results = {}
    for arm, seed in jobs(seeds):
        record = folder.record(f"scratch-{arm.key}-{seed}")
        if record is None or record["inputs"] != _inputs(shape, sequences, arm) or not record["done"]:
            if partial:
                continue
            return None
        results[f"{arm.key}-{seed}"] = json.loads(record["result"])
    return results or None


def _inputs(shape: TinyModel, sequences: int, arm: Arm) -> str:
    """What a model's record depends on: a change to any of these redoes it."""
    fields = asdict(arm)
    if arm.steps == 1.0:  # added after the study's first models: at its default it leaves their records valid
        del fields["steps"]
    return digest(
        json.dumps(asdict(shape)), json.dumps(fields), json.dumps(TESTS), str(sequences), str(TEST_SEED)
    )


def _runs(results: dict[str, Any], seeds: int) -> Runs:
    """{arm key: [(seed, result)]} of the models in `results`, each arm's seeds in order."""
    return {arm.key: [(seed, results[f"{arm.key}-{seed}"]) for a, seed in jobs(seeds)
                      if a is arm and f"{arm.key}-{seed}" in results] for arm in ARMS}  # fmt: skip


def learned_counts(results: dict[str, Any], seeds: int) -> dict[str, tuple[int, int]]:
    """{arm label: (models that learned, models)} of the arms with a model in `results`."""
    labels = {arm.key: arm.label for arm in ARMS}
    return {labels[key]: (sum(_share(r["1x"]) >= LEARNED for _, r in done), len(done))
            for key, done in _runs(results, seeds).items() if done}  # fmt: skip


def _fell_step(result: dict[str, Any]) -> int | None:
    """The step from which the answers' training loss stayed under FELL (each 100-step mean of `curve`), if it
    did (None: never, or a result recorded before curves were)."""
    curve = result.get("curve") or []
    for i in range(len(curve)):
        if all(loss < FELL for loss in curve[i:]):
            return 100 * i
    return None


def _fell(result: dict[str, Any]) -> str:
    step = _fell_step(result)
    return "-" if step is None else str(step)


def loss_curves(
    results: dict[str, Any], shape: TinyModel, seeds: int
) -> tuple[dict[str, dict[str, dict[int, float]]], set]:
    """({arm label: {"seed N": {step: answers' loss}}}, the (label, "seed N") that learned) of the models in
    `results` that recorded a curve: `plots.plot_loss_panels`'s input."""
    arms = {arm.key: arm for arm in ARMS}
    curves: dict[str, dict[str, dict[int, float]]] = {}
    learned = set()
    for key, done in _runs(results, seeds).items():
        steps, label = arms[key].shaped(shape).steps, arms[key].label
        for seed, r in done:
            if r.get("curve"):
                curves.setdefault(label, {})[f"seed {seed}"] = {
                    min(100 * (i + 1), steps): x for i, x in enumerate(r["curve"])
                }
                if _share(r["1x"]) >= LEARNED:
                    learned.add((label, f"seed {seed}"))
    return curves, learned


def _share(right_scored: list[int]) -> float:
    return right_scored[0] / right_scored[1]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _rank_rows(runs: Runs, learned: Runs) -> list[list[str]]:
    """Per arm: learned k/n, the share with its Wilson interval over seeds, Fisher's test against the arm it is
    compared with and the difference those counts detect, each seed's accuracy at the training length."""
    from ...eval.intervals import detectable_difference, fisher_greater, wilson_interval

    arms, rows = {arm.key: arm for arm in ARMS}, []
    for key, done in runs.items():
        if not done:
            continue
        n, k = len(done), len(learned[key])
        low, high = wilson_interval(k / n, n)
        test = detect = "-"
        if (other := arms[key].against) and runs[other]:
            m, j = len(runs[other]), len(learned[other])
            test = f"{fisher_greater(k, n, j, m):.3f} (vs {arms[other].label}: {j}/{m})"
            d = detectable_difference(n, m, j / m)
            detect = f"+{_pct(d)} points" if math.isfinite(d) else "none"
        per_seed = " / ".join(_pct(_share(r["1x"])).removesuffix(".0") for _, r in done)
        rows.append([arms[key].label, f"{k}/{n}", f"{_pct(k / n)} [{_pct(low)}, {_pct(high)}]", test, detect,
                     per_seed])  # fmt: skip
    return rows


def _among_rows(learned: Runs) -> list[list[str]]:
    """Per arm, among its models that learned: how many, when their loss fell (median [min, max]), and each
    test's mean accuracy with its t interval over seeds (within 0-100)."""
    from ...eval.intervals import t_interval

    labels, rows = {arm.key: arm.label for arm in ARMS}, []
    for key, done in learned.items():
        if not done:
            continue
        cells = []
        for test in TESTS:
            values = [_share(r[test]) for _, r in done]
            interval = ""
            if len(values) > 1:
                low, high = t_interval(values)
                interval = f" [{_pct(max(low, 0.0))}, {_pct(min(high, 1.0))}]"
            cells.append(f"{_pct(sum(values) / len(values))}{interval}")
        fell = sorted(s for _, r in done if (s := _fell_step(r)) is not None)
        when = f"{statistics.median(fell):.0f} [{fell[0]}, {fell[-1]}]" if fell else "-"
        rows.append([labels[key], str(len(done)), when, *cells])
    return rows


def _model_rows(runs: Runs) -> tuple[list[list[str]], list[list[str]]]:
    """Every model's row (its tests, loss, when it fell, time and load), and every RePo model's positions."""
    labels, every, positions = {arm.key: arm.label for arm in ARMS}, [], []
    for key, done in runs.items():
        for seed, r in done:
            mark = "yes" if _share(r["1x"]) >= LEARNED else "no"
            every.append([labels[key], str(seed), mark, *(_pct(_share(r[test])) for test in TESTS),
                          f"{r['loss']:.3f}", _fell(r), f"{r['wall_s'] / 60:.1f}",
                          f"{r.get('load', float('nan')):.1f}"])  # fmt: skip
            if "positions" in r:
                layers = [f"{layer}: {s['std']:.2f}, [{s['p05']:.2f}, {s['p95']:.2f}], {s['rank_corr']:+.2f}"
                          for layer, s in r["positions"].items()]  # fmt: skip
                positions.append([labels[key], str(seed), mark, "; ".join(layers)])
    return every, positions


def scratch_section(
    results: dict[str, Any], shape: TinyModel, seeds: int, sequences: int = TEST_SEQUENCES
) -> str:
    """The Markdown section: which models learned and how the arms rank by it; the tests among the models that
    learned; every model's figures; the RePo models' positions; the setup. `results` may hold part of the study
    (the models finished so far): the section says how many."""
    runs = _runs(results, seeds)
    learned = {
        key: [(seed, r) for seed, r in done if _share(r["1x"]) >= LEARNED] for key, done in runs.items()
    }
    ranks, among = _rank_rows(runs, learned), _among_rows(learned)
    every, positions = _model_rows(runs)

    t = shape.task
    total = len(jobs(seeds))
    status = "" if len(results) >= total else f" (**{len(results)} of its {total} models so far**)"
    minutes = sum(r["wall_s"] for r in results.values()) / 60
    loads = [r["load"] for r in results.values() if "load" in r]
    return (
        f"## From scratch: recall among distractors, at the training length, longer, and noisier{status}\n\n"
        f"{shape.layers}-layer models (d={shape.hidden}, {shape.heads} heads), trained from scratch for "
        f"{shape.steps} steps (the longer arm: its multiple) of {shape.batch} sequences of {t.length} tokens, "
        f"each holding {t.pairs} key-value "
        f"pairs among noise (a grammar makes {t.rule:.0%} of the noise follow from the token two back) and "
        f"{t.queries} queries, trained on the answers and the noise. RePo and NoPE in RePo's layers from layer "
        f"{shape.layers // 3} (RoPE below), as the paper's 1B. Matched: for one seed every arm starts from the same "
        "weights where it shares a tensor (f_phi's drawn apart), reads the same batches and is tested on the same "
        f"{sequences} sequences per test. A model **learned** when it answers at least {LEARNED:.0%} of the queries "
        f"at the training length (fixed before the runs); guessing among the context's values scores 1 in "
        f"{t.pairs}.\n\n"
        "### Which models learned\n\n"
        f"![learned shares]({FIGURE})\n\n![answers' loss curves]({CURVES})\n\n"
        "Learned share over seeds with its Wilson 95% interval; the one-sided Fisher exact test that the arm learns "
        "more often than the one it is compared with, and the smallest true excess over that arm's observed share "
        "these seed counts detect (80% power, 5% one-sided); each seed's accuracy at the training length.\n\n"
        + markdown_table(
            ["model", "learned", "share % [95%]", "Fisher p", "detectable", "% at 1x, per seed"], ranks
        )
        + "\n\n### Among the models that learned\n\n"
        "Accuracy % per test: the mean over the models that learned, with its t 95% interval over seeds (cut to "
        "0-100; each "
        "seed's figure in the table below); the step from which the answers' training loss stayed under "
        f"{FELL} (median, [min, max]). Tests: at 4x and 8x the length with as many times the pairs, as "
        "trained and with YaRN (its factor from the training length); at the training length with 2x and 4x the "
        f"pairs (distractors). Guessing scores 1 in {4 * t.pairs} at 4x and 1 in {8 * t.pairs} at 8x.\n\n"
        + (
            markdown_table(["model", "learned", f"loss < {FELL} from step", *TESTS], among)
            if among
            else "(none learned)"
        )
        + "\n\n### Every model\n\n"
        + markdown_table(
            [
                "model",
                "seed",
                "learned",
                *(f"% {test}" for test in TESTS),
                "answers' train loss, last 100 steps",
                f"loss < {FELL} from step",
                "min",
                "load",
            ],
            every,
        )  # fmt: skip
        + "\n\nRePo's positions on test sequences at the training length (per layer: std, 5th-95th percentile, "
        "Spearman's rank correlation with the token index):\n\n"
        + markdown_table(["model", "seed", "learned", "layers"], positions)
        + f"\n\n{len(results)} models, {minutes:.0f} min of training and testing in all (one core each, two at a "
        "time)"
        + (
            f"; the 1-minute load average at their ends from {min(loads):.1f} to {max(loads):.1f}"
            if loads
            else ""
        )
        + ".\n"
    )
