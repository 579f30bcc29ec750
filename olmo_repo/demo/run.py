"""`make demo`: a tiny RePo continual pre-training on CPU, offline, through `olmo_repo.cli.train`, and a report.

1. Builds a corpus in OLMo's memmap format (uint32 token ids in 512-token windows, documents separated by
   <|endoftext|>) with the shipped base model's 4,096-token BPE (dolma2's pre-tokenizer): RULER NIAH documents
   (prompt and answer, from the generator the evaluation uses, with other seeds), short retrieval practice,
   stories (`olmo_repo.demo.corpus`).
2. Converts the shipped tiny base model (`olmo_repo/demo/base_model/`, HF, the analogue of a pre-trained OLMo-2
   checkpoint; `olmo_repo.demo.base` says why and how it was built) to an OLMo checkpoint and continues it
   with RoPE on the corpus ("stage 1", `tiny-stage1-rope.yaml`, a fresh optimizer).
3. Continues it with RePo and with plain RoPE ("stage 2", `tiny-stage2-{repo,rope}.yaml`), both from the
   stage-1 checkpoint with its optimizer state, as the released recipe does; prints a table (steps, losses,
   tokens/s, wall time, the range of the positions of every RePo layer, checkpoints).
4. Converts both stage-2 models to HF and writes `report.md` (`olmo_repo.eval.report`): NIAH at 512, 1024 and
   2048 tokens (YaRN x2, x4), attention mass, learned positions, training FLOPs.

Everything goes into one folder (`DemoFolder`): a new or empty one, or a previous demo's, whose outputs are
replaced while anything else in it stays. A non-empty folder that no demo wrote is refused before any work.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import CorruptFileError
from ..tables import markdown_table
from . import BASE_DIR, config_path
from .folder import DemoFolder
from .training import RunResult, run_training

__all__ = ["run_demo"]

_HEADER = [
    "run",
    "steps",
    "loss first",
    "loss last",
    "val loss",
    "tokens/s",
    "wall s",
    "RePo positions, layer:[min,max]",
]


def _rows(results: list[RunResult]) -> list[list[str]]:
    return [
        [
            r.name,
            str(r.steps),
            f"{r.first_loss:.3f}",
            f"{r.last_loss:.3f}",
            "-" if r.eval_loss is None else f"{r.eval_loss:.3f}",
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            f"{r.wall_s:.0f}",
            r.positions,
        ]
        for r in results
    ]


def _table(results: list[RunResult]) -> str:
    """The console table: the runs, with their checkpoints."""
    rows = [[*row, r.checkpoint] for row, r in zip(_rows(results), results)]
    header = [*_HEADER, "checkpoint"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _train(folder: DemoFolder, name: str, *overrides: str) -> RunResult:
    folder.entry(f"{name}.log")  # run_training writes the full log beside the run
    return run_training(name, config_path(name), folder.entry(name), *overrides)


def run_demo(out: Path = Path("runs/demo"), samples: int = 20, base_dir: Path = BASE_DIR) -> list[RunResult]:
    """The whole demo under `out` (see `DemoFolder`; relative to the current directory): corpus, stage 1 from
    the base model `base_dir` (default: the shipped one), stage 2 with RePo and with RoPE, and the report
    (`samples` NIAH prompts per variant and length). A refused folder or a damaged base model raises
    `RepoError` before anything is written."""
    start = time.monotonic()
    folder = DemoFolder(
        out.resolve()
    )  # before the imports below (lm-eval, transformers: seconds): quick refusal
    from ..eval.report import write_report
    from ..hf.convert import convert_from_hf, convert_to_hf
    from .base import base_tokenizer
    from .corpus import BATCH, SEQ_LEN, build_corpus

    folder.clear()
    tokenizer = base_tokenizer(base_dir)
    try:  # an unsharded checkpoint at step 0, without optimizer state; written only once complete
        base = convert_from_hf(base_dir, folder.entry("base"))
    except (OSError, CorruptFileError) as e:
        raise CorruptFileError(
            f"{e} (the shipped base model: reinstall olmo-repo, or rebuild it with `make demo-base`)"
        ) from e
    print(f"Base model {base_dir} -> {base}", flush=True)
    data_dir = folder.entry("data")
    print(f"Building the corpus under {data_dir}...", flush=True)
    paths = build_corpus(data_dir, tokenizer)
    sizes = ", ".join(f"{k} {p.stat().st_size // 4:,} tokens" for k, p in paths.items() if p.suffix == ".npy")
    print(f"   {sizes}", flush=True)
    data = f"--data_prefix={data_dir}"
    init = (f"--load_path={base}", "--reset_optimizer_state=true")
    stage1 = _train(folder, "stage1-rope", data, *init)
    load = f"--load_path={stage1.checkpoint}"
    results = [stage1]
    for variant in ("repo", "rope"):
        results.append(_train(folder, f"stage2-{variant}", data, load))
    print(f"\nTrained in {time.monotonic() - start:.0f} s. Losses are token cross-entropy (nats).\n")
    print(_table(results), flush=True)

    print("\nEvaluating the stage-2 models for the report...", flush=True)
    # As scripts/eval.py: lm-eval's per-task notes are noise here; its errors still show.
    from ..upstream import lm_eval

    lm_eval.quiet()
    models = {
        label: convert_to_hf(r.checkpoint, folder.entry(f"{r.name}-hf"))
        for label, r in zip(("RePo", "RoPE"), results[1:])
    }
    folder.entry("figures")
    report = write_report(
        folder.entry("report.md"),
        models,
        title="`make demo`: tiny RePo against RoPE",
        preamble=_preamble(results),
        samples=samples,
        tokens=results[1].steps * BATCH * SEQ_LEN,
    )
    print(f"\nDemo finished in {time.monotonic() - start:.0f} s. Report: {report}", flush=True)
    return results


def _preamble(results: list[RunResult]) -> str:
    from .corpus import NIAH_VARIANTS, SEQ_LEN, VOCAB

    return (
        f"A tiny OLMo-2-shaped model (d_model 128, 4 layers, tied embeddings, {SEQ_LEN}-token context, "
        f"{VOCAB:,}-token BPE): the shipped base model (`olmo_repo/demo/base_model/`, 4,000 steps of RoPE "
        f"pre-training, built by `make demo-base`) continued with RoPE (stage 1), then continued from that "
        f"checkpoint with RePo on layers 1-3 and, for comparison, with RoPE (stage 2), on a generated corpus "
        f"with RULER NIAH documents "
        f"({', '.join(NIAH_VARIANTS)}; seeds the evaluation does not use), short retrieval practice and "
        f"stories. Evaluated as Hugging Face models (`scripts/convert_to_hf.py`).\n\n## Training\n\n"
        f"{markdown_table(_HEADER, _rows(results))}\n\nLosses are token cross-entropy (nats).\n"
    )
