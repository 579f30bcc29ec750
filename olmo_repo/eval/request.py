"""`scripts/eval.py`'s work: check a request, evaluate it length by length, write its results.

- `EvalRequest`: what to evaluate, as the command's flags say it (parsed by `olmo_repo.eval.variants`); its
  `positions` replaces the positions of RePo layers (`loading.position_overrides`: the token index or one
  constant position), on either backend, for an ablation of what the learned positions contribute.
- `check_request(request)`: the request and the model's files, before torch, transformers or lm-eval load.
- `evaluate_request(request) -> Evaluation`: every input checked first (the tokenizer, and that every task
  builds its prompts at each length), then per length the model loaded (YaRN past its training length) on
  the request's backend and its tasks run; the results dict and NIAH's per-sample records.
- `write_results(request, evaluation)`: `results.json`, `results.md` (`results_table`) and, for NIAH,
  `samples.jsonl` in `request.out`, each file whole or not at all.

An existing non-empty `out` is refused unless `overwrite`; then only `OUTPUTS` are replaced, nothing else
there is touched. Nothing is written before the evaluation is done: an interrupted run leaves `out` as it was,
and a rerun of the same request writes the same bytes. `results.json` is the record of a finished run: the files
beside it are that run's. A run replacing an earlier one removes the earlier record first and writes its own
last, so a kill while the files are renamed into place leaves each file whole and no record (an unfinished
run, which the rerun completes), never one run's record beside another run's samples.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import output
from ..errors import RepoError
from ..integrity import ModelOpener, hf_dir_as_is, require_model_dir
from ..modes import PositionSource
from .intervals import wilson_interval
from .variants import NIAH_LENGTHS, RULER_SAMPLES, RULER_SEED, VARIANTS

__all__ = [
    "OUTPUTS",
    "EvalRequest",
    "Evaluation",
    "check_request",
    "evaluate_request",
    "results_table",
    "write_results",
]

OUTPUTS = ("results.json", "results.md", "samples.jsonl")


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation: `model` (a model directory, as `evaluate_request`'s `open_model` opens it) on the NIAH
    `variants` (or, with `suite`, the paper's suite) at each of `lengths`; results into the folder `out`."""

    model: str
    out: Path
    variants: tuple[str, ...] = tuple(VARIANTS)
    lengths: tuple[int, ...] = NIAH_LENGTHS
    suite: bool = False
    samples: int | None = None  # per NIAH variant and length (None: RULER's); with `suite`, lm-eval's limit
    seed: int = RULER_SEED
    batch_size: int = 8
    yarn: str | float = "auto"  # `olmo_repo.eval.loading.yarn_factor`
    essays: str = "offline"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str | None = None  # None: cuda if available, else cpu
    backend: str = "hf"
    positions: str = PositionSource.learned  # what RePo layers rotate by (`loading.position_overrides`)
    overwrite: bool = False


@dataclass
class Evaluation:
    """The results dict (what `results.json` holds) and NIAH's per-sample records (`samples.jsonl`)."""

    results: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


def check_request(request: EvalRequest) -> None:
    """Raise ValueError (or `RepoError` for the model's files) naming the flag or file that is wrong."""
    check_out(request.out, request.overwrite)
    if request.samples is not None and request.samples < 1:
        raise ValueError(f"--samples={request.samples}: must be >= 1")
    if request.batch_size < 1:
        raise ValueError(f"--batch-size={request.batch_size}: must be >= 1")
    require_model_dir(
        request.model, tokenizer=True
    )  # missing, not a model or a damaged file: before the heavy imports


def check_out(out: Path, overwrite: bool) -> None:
    """`out` is absent or empty, or `overwrite` says its outputs may be replaced."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out}: exists and is not empty; pass --overwrite to replace its results")


def evaluate_request(request: EvalRequest, open_model: ModelOpener = hf_dir_as_is) -> Evaluation:
    """Check `request`, then evaluate it (see the module docstring); writes nothing. `open_model` yields the HF
    directory of `request.model` (`scripts/eval.py` passes `olmo_repo.checkpoint.as_hf_dir`)."""
    check_request(request)
    import torch

    from ..upstream import lm_eval
    from .loading import position_overrides, read_config, training_length, yarn_overrides

    lm_eval.quiet()  # lm-eval's per-task notes on custom datasets are noise here; its errors still show
    device = request.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = request.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    with open_model(request.model) as hf_dir:
        config = read_config(hf_dir)  # a family evaluation does not take: one line, before the tokenizer
        source = f"{request.model}/config.json"
        position_overrides(config, request.positions, source)  # replaced positions without RePo layers
        for length in request.lengths:  # a length YaRN cannot reach (a RoPE scaled otherwise): before weights
            yarn_overrides(config, length, request.yarn, source)
        tokenizer = _tokenizer(request.model, hf_dir)
        stages, refused = plan_stages(request)
        check_prompts(request, tokenizer, stages)  # a length a task cannot build stops here, before weights
        if refused:
            from . import suite

            print(suite.refusal(refused), file=sys.stderr)
        training = training_length(config)
        evaluation = Evaluation(_results_head(request, training))
        for length, tasks in stages:
            if tasks:  # none: every suite task of this length was refused
                evaluate_length(request, evaluation, hf_dir, tokenizer, length, tasks, dtype, device)
    if refused:
        evaluation.results["refused"] = refused
    return evaluation


def _tokenizer(model: str, hf_dir: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(hf_dir)
    except (OSError, ValueError) as e:
        raise ValueError(f"{model}: no tokenizer could be loaded ({e})") from None


def plan_stages(request: EvalRequest) -> tuple[list[tuple[int, list[str]]], list[str]]:
    """[(length, tasks)] and the suite's tasks refused without a network (each named once). NIAH: the
    variants at every length; the suite: `suite.plan` less what cannot be downloaded (`suite.network` probes
    the Hub)."""
    if not request.suite:
        return [(length, list(request.variants)) for length in request.lengths], []
    from . import suite

    stages = suite.plan(list(request.lengths))
    online = suite.network()
    refused = list(dict.fromkeys(t for _, tasks in stages for t in tasks if not suite.available(t, online)))
    return [(length, [t for t in tasks if t not in refused]) for length, tasks in stages], refused


def check_prompts(request: EvalRequest, tokenizer: Any, stages: list[tuple[int, list[str]]]) -> None:
    """Every task of every stage builds its prompts with `tokenizer`; ValueError naming the first that
    cannot."""
    from . import niah, suite

    if request.suite:
        suite.check_lengths(tokenizer, stages, request.seed, request.essays)
        return
    for length, variants in stages:
        for variant in variants:
            niah.niah_samples(tokenizer, variant, length, 1, request.seed, request.essays)


def _results_head(request: EvalRequest, training: int) -> dict[str, Any]:
    return {
        "model": str(request.model),
        "mode": "suite:paper" if request.suite else "niah",
        "positions": str(request.positions),
        "training_length": training,
        "samples": request.samples,
        "seed": request.seed,
        "essays": request.essays,
        "lengths": {},
        "scores": {},
    }


def evaluate_length(
    request: EvalRequest,
    evaluation: Evaluation,
    hf_dir: Path,
    tokenizer: Any,
    length: int,
    tasks: list[str],
    dtype: str,
    device: str,
) -> None:
    """Load the model for `length` on the request's backend, run `tasks`, add their scores to `evaluation`."""
    from . import niah, suite
    from .loading import yarn_factor

    model = load_backend(request, hf_dir, length, dtype, device)
    try:
        results = evaluation.results
        results["lengths"][str(length)] = {
            "yarn_factor": yarn_factor(length, results["training_length"], request.yarn),
            "rope_parameters": dict(model.config.rope_parameters or {}),
        }
        options = dict(seed=request.seed, batch_size=request.batch_size, essays=request.essays)
        if request.suite:
            by_task = suite.run_stage(model, tokenizer, length, tasks, samples=request.samples, **options)
            for task, metrics in by_task.items():
                results["scores"].setdefault(task, {})[length] = suite.main_metric(metrics, length)
            results.setdefault("lm_eval", {})[str(length)] = by_task
        else:
            samples = request.samples or RULER_SAMPLES
            scores, records = niah.evaluate(
                model, tokenizer, length, variants=tasks, samples=samples, **options
            )
            for variant, row in scores.items():
                results["scores"].setdefault(variant, {}).update(row)
                results.setdefault("intervals95", {}).setdefault(variant, {}).update(
                    {n: wilson_interval(score, samples) for n, score in row.items()}
                )
            evaluation.records += records
    finally:
        release_backend(request, model)


def load_backend(request: EvalRequest, hf_dir: Path, length: int, dtype: str, device: str) -> Any:
    """The model at `length` (YaRN per `request.yarn`, RePo layers rotating by `request.positions`):
    transformers', or lm-eval's vLLM model."""
    if request.backend == "vllm":
        from .vllm_backend import load_vllm

        return load_vllm(hf_dir, length, request.yarn, dtype, request.batch_size, positions=request.positions)
    from .loading import load_model

    return load_model(hf_dir, length, request.yarn, dtype, device, request.positions)


def release_backend(request: EvalRequest, model: Any) -> None:
    """Free what the model holds beyond its memory: vLLM's engine (the next length starts its own)."""
    if request.backend == "vllm":
        from .vllm_backend import release

        release(model)


def results_table(results: dict[str, Any]) -> str:
    """The Markdown of `results.md`: NIAH's table (percent, with the average), or one row per suite task."""
    positions = results.get("positions", PositionSource.learned)
    replaced = (
        "" if positions == PositionSource.learned else f", RePo layers rotating by the {positions} position"
    )
    head = f"# {results['mode']} on {results['model']}{replaced}\n\n"
    if results["mode"] == "niah":
        from .niah import markdown_table

        return head + markdown_table(results["scores"], results["samples"] or RULER_SAMPLES)
    scores = results["scores"]
    lengths = sorted({length for row in scores.values() for length in row})
    lines = ["| task | " + " | ".join(map(str, lengths)) + " |", "| --- |" + " ---: |" * len(lengths)]
    for task, row in scores.items():
        cells = [f"{100 * row[length]:.1f}" if row.get(length) is not None else "" for length in lengths]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    if refused := results.get("refused"):
        lines += ["", f"Not run (need downloading): {', '.join(refused)}"]
    return head + "\n".join(lines) + "\n"


def write_results(request: EvalRequest, evaluation: Evaluation) -> list[Path]:
    """Write the evaluation's files into `request.out` (see the module docstring); returns their paths.

    An earlier run's `results.json`, the record that a run finished, is removed before anything is replaced, and
    this run's is renamed into place last. A previous run's output that this run does not write (`samples.jsonl`
    after a suite run) is removed after it, and so are the temporary files that a run killed while writing
    left."""
    out = request.out
    if not request.overwrite and out.is_dir() and (present := [n for n in OUTPUTS if (out / n).exists()]):
        raise RepoError(f"--out {out}: {', '.join(present)} appeared while this evaluation ran; not replaced")
    texts = {}  # in the order they are written
    if evaluation.records:
        texts["samples.jsonl"] = "".join(json.dumps(r) + "\n" for r in evaluation.records)
    texts["results.md"] = results_table(evaluation.results)
    texts["results.json"] = json.dumps(evaluation.results, indent=2, default=str) + "\n"
    (out / "results.json").unlink(missing_ok=True)  # the earlier run's record: its files are replaced now
    for name, text in texts.items():
        output.write_file(out / name, text)
    for name in OUTPUTS:
        if name not in texts:
            (out / name).unlink(missing_ok=True)
        output.remove_partials(out / name)  # of a run killed while writing
    return [out / name for name in OUTPUTS if name in texts]
