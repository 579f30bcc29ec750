"""The SmolLM2 recipe's arms are data (overrides of one config) and every fact the recipe states of a run is the
config's, as OLMo-core builds it for the arm; its report reads a stage's records only once the stage finished."""

from __future__ import annotations

from olmo_repo.experiments.smollm2.options import KNOWN_ARMS, LEARNING, PAPER, ROPE, Recipe, run_config
from olmo_repo.experiments.smollm2.report import RecipeReport
from olmo_repo.metrics import METRICS_FILE, append_metrics


def test_each_arm_s_facts_are_what_its_config_builds():
    paper, learning, rope = run_config(PAPER), run_config(LEARNING), run_config(ROPE)
    assert (paper.mode, paper.blended, paper.layers) == ("repo", False, "9..29")
    assert (learning.mode, learning.blended, learning.blend_init, learning.blend_steps) == (
        "repo",
        True,
        1.0,
        50,
    )
    assert (rope.mode, rope.blended) == ("rope", False)
    assert run_config(KNOWN_ARMS["nope"]).mode == "nope"
    assert run_config(KNOWN_ARMS["repo-blend"]).blended and not run_config(KNOWN_ARMS["repo-lr240"]).blended
    # the config's batches and optimizer (configs/olmocore/smollm2-repo.py and the tiny config it builds on)
    assert (paper.window, paper.windows, paper.lr, paper.schedule) == (256, 4, 7.4487e-5, "linear to 0")
    assert (paper.betas, paper.weight_decay) == ((0.9, 0.95), 0.1)
    assert LEARNING.args == (
        "--model.block.sequence_mixer.pe_blend_init=1.0",
        "--model.block.sequence_mixer.pe_blend_steps=50",
        "--f_phi.lr_multiplier=240",
    )


def test_the_recipe_report_reads_a_held_out_stage_only_once_it_finished(tmp_path):
    """A held-out stage that started and was stopped records no losses: the report of a rerun's first stages
    leaves it out instead of failing; the training table gives the last steps' mean and the logged positions."""
    report = RecipeReport(tmp_path / "recipe", Recipe(arms=(PAPER,)))
    report.state("train-repo", "x", ["run-repo"])
    report.entry("run-repo").mkdir()
    positions = {
        f"train/positions/layer{i}/{s}": v for i in (9, 10) for s, v in (("std", i), ("rank_corr", 0.5))
    }
    for step in range(1, 13):
        append_metrics(
            report.path / "run-repo" / METRICS_FILE, step, {"train/CE loss": float(step), **positions}
        )
    report.finish("train-repo")
    report.state("heldout", "y", [])  # under way (or stopped): not finished
    report.publish()
    text = (report.path / "report.md").read_text()
    assert "| RePo | 12 | 1.000 | 7.500 | 9.5 | +0.50 |" in text and "Held-out loss" not in text
    assert "## Insertion cost and training" in text and (report.path / "figures" / "loss.png").is_file()
