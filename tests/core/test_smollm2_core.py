"""A real pretrained model through the OLMo-core pipeline: SmolLM2-135M-Instruct (Q4_1 dequantised, a stock `llama`
HF directory built once per session: tests/real_models.py), its stage-1 start, a few training steps on English
text in two gloo processes, and back to HF.

- The stock model converted to OLMo-core and back gives transformers' logits exactly; the recipe's RePo model
  (`configs/olmocore/smollm2-repo.py`, layers 9..29) starts from the converted checkpoint with exactly the f_phi
  weights of those layers new.
- `scripts/tokenize_text.py` writes Python's documentation (pydoc_data.topics, ~113k tokens) with the model's own
  tokenizer; the data-tokenizer check takes it with the SmolLM2 checkpoint and refuses the demo's and dolma2 data.
- `scripts/core_train.py --nproc-per-node=2` trains 2 steps of 4 x 128 tokens from the stage-1 checkpoint: the
  step-1 loss is the step-0 model's on the batch the data loader drew (recomputed here), a pretrained model's
  (below ln(V) / 2); the last checkpoint converted to `repo_llama` gives OLMo-core's logits in fp32.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from olmo_repo.cli import core_train, tokenize_text
from olmo_repo.data.tokens import TOKENS_FILE
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.fit import f_phi_layer
from olmo_repo.modes import F_PHI_WEIGHTS, SCORED_PE_KEYS
from olmo_repo.olmocore import checkpoint
from olmo_repo.olmocore.attention import with_position_modes
from olmo_repo.olmocore.hf import core_to_hf, hf_to_core
from olmo_repo.olmocore.stage1 import check_stage1
from olmo_repo.olmocore.train import load_build_config
from olmo_repo.rope import record_positions

from ..bounds import logprob_bound
from ..round_trips import HF_MAY_DIFFER, config_differences
from .test_train import _run
from .tiny import assert_within, logit_roundings
from .training import ROOT, metrics

pytestmark = pytest.mark.slow  # a 135M-parameter model (conversions of 0.5 GB, fp32 forwards)

CONFIG = ROOT / "configs" / "olmocore" / "smollm2-repo.py"
REPO_LAYERS = list(range(9, 30))  # ceil(30 / 3) - 1 = 9
VOCAB = 49152
SEQ = 128  # the test run's windows: 128 tokens, one per rank and step (the config's: 256, two per rank)
WINDOWS = 2
STEPS = 2


def _experiment(save: Path, data: Path, *overrides: str):
    opts = argparse.Namespace(
        name="t", sequence_length=SEQ, data_root=str(data), save_folder=str(save), work_dir=str(save)
    )
    return load_build_config(CONFIG)(opts, list(overrides))


@pytest.fixture(scope="module")
def stage1(smollm2_dir, tmp_path_factory) -> Path:
    """The stock model as a model-only OLMo-core checkpoint (`scripts/core_convert_from_hf.py`)."""
    return hf_to_core(smollm2_dir, tmp_path_factory.mktemp("smollm2-core") / "stage1")


@pytest.fixture(scope="module")
def pydoc(smollm2_dir, tmp_path_factory) -> Path:
    """Python's documentation tokenised with SmolLM2's tokenizer (`scripts/tokenize_text.py`)."""
    out = tmp_path_factory.mktemp("smollm2-data") / "pydoc"
    assert tokenize_text.main(["--model", str(smollm2_dir), "--output", str(out), "--no-progress"]) == 0
    return out


def _ids(path: Path) -> np.ndarray:
    return np.fromfile(path / TOKENS_FILE, dtype="<u4")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_stock_model_through_olmo_core_and_back_gives_its_logits_exactly(
    smollm2_dir, stage1, pydoc, tmp_path
):
    """HF -> OLMo-core (`pe_mode=rope`: the stock weights, nothing else) -> HF: every tensor and the logits in fp32
    equal (torch.equal), config.json whole, a stock `llama` without remote code."""
    back = core_to_hf(stage1, tmp_path / "hf")
    assert _json(back / "config.json")["model_type"] == "llama" and not (back / "rope.py").exists()
    # scripts/smollm2.py states no `architectures` (the GGUF names none); save_pretrained writes the class
    assert config_differences(
        _json(smollm2_dir / "config.json"), _json(back / "config.json"), HF_MAY_DIFFER
    ) == {"architectures": ("<absent>", ["LlamaForCausalLM"])}
    stock = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    again = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    first, second = stock.state_dict(), again.state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    ids = torch.tensor(_ids(pydoc)[None, :96].astype(np.int64))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, stock(ids).logits)


def test_the_recipe_is_the_converted_model_with_repo_from_layer_9(stage1, tmp_path):
    """configs/olmocore/smollm2-repo.py builds exactly the converted checkpoint's model with RePo in layers 9..29,
    which fits the checkpoint by the stage-1 rule: every tensor of the checkpoint with its name and shape, and the
    f_phi weights of layers 9..29 new, nothing else. (How a run loads it, every base tensor bit-exact and f_phi
    with the recipe's init, the two-process test below checks on the run's step 0.)"""
    config = _experiment(tmp_path / "run", tmp_path / "data").model
    stock = checkpoint.model_config(stage1)
    assert config.as_config_dict() == with_position_modes(stock, "repo", pe_start_layer=9).as_config_dict()
    check_stage1(str(stage1), config)
    shapes = {k: v.shape for k, v in config.build(init_device="meta").state_dict().items()}
    stock_shapes = {k: v.shape for k, v in stock.build(init_device="meta").state_dict().items()}
    new = {f"blocks.{i}.attention.{name}.weight" for i in REPO_LAYERS for name in F_PHI_WEIGHTS}
    assert set(shapes) - set(stock_shapes) == new and {k: shapes[k] for k in stock_shapes} == stock_shapes


def _assert_initialised(f_phi: dict[str, torch.Tensor], std: float) -> None:
    """f_phi as OLMo's init draws it: normal with `std`, truncated at 3 std (whose std is 0.986 std); the sample std
    of n draws within 5 of its standard errors (std / sqrt(2n)). Not initialised (zeros), or PyTorch's default
    (uniform +- 1 / sqrt(fan_in)), fails."""
    for name, w in f_phi.items():
        error = 5 * std / math.sqrt(2 * w.numel())
        assert w.abs().max() <= 3 * std and abs(w.std().item() - 0.986 * std) <= error, (name, w.std().item())


def test_tokenize_text_writes_the_docs_with_the_models_tokenizer(smollm2_dir, pydoc, tmp_path, capsys):
    """Every topic of pydoc_data.topics, in name order, as SmolLM2's tokenizer encodes it, each followed by the
    end id the model states (2, `<|im_end|>`); the tokenizer.json beside is the model's. A rerun onto the folder is
    refused in one line (--force replaces it); a model folder without a tokenizer is one line, nothing written."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    expected = []
    for name in sorted(topics):
        expected += [*tokenizer.encode(topics[name], add_special_tokens=False).ids, 2]
    ids = _ids(pydoc)
    assert ids.tolist() == expected and 100_000 < len(ids) and ids.max() < VOCAB
    assert (pydoc / "tokenizer.json").read_bytes() == (smollm2_dir / "tokenizer.json").read_bytes()
    assert tokenizer.decode(ids[: ids.tolist().index(2)].tolist()) == topics[sorted(topics)[0]]

    argv = ["--model", str(smollm2_dir), "--output", str(pydoc), "--no-progress"]
    capsys.readouterr()
    assert tokenize_text.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tokenize_text.py: error: ") and "--force" in err, err
    copy = tmp_path / "copy"
    shutil.copytree(pydoc, copy)
    assert tokenize_text.main([*argv[:3], str(copy), "--no-progress", "--force", "--eos-token-id=0"]) == 0
    assert _ids(copy)[len(expected) - 1] == 0 and (_ids(copy) == 0).sum() == len(topics)
    (tmp_path / "bare").mkdir()
    shutil.copyfile(smollm2_dir / "config.json", tmp_path / "bare" / "config.json")
    capsys.readouterr()
    assert tokenize_text.main(["--model", str(tmp_path / "bare"), "--output", str(tmp_path / "out")]) == 1
    assert "has no tokenizer.json" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _data_with(tmp_path: Path, name: str, tokenizer: Path) -> Path:
    data = tmp_path / name
    data.mkdir()
    (data / TOKENS_FILE).write_bytes(b"\0" * 4 * SEQ * 16)
    shutil.copyfile(tokenizer, data / "tokenizer.json")
    return data


@pytest.mark.parametrize("data", ["demo", "dolma2"])
def test_the_tokenizer_check_takes_smollm2_data_and_refuses_other_data(stage1, pydoc, tmp_path, capsys, data):
    """Before anything starts: SmolLM2's data with the SmolLM2 checkpoint can train; the demo's data (its 4096-token
    tokenizer.json under the config's SmolLM2 settings) and dolma2's (TokenizerConfig.dolma2(): 100,278 ids) are
    one line each, nothing written."""
    save = tmp_path / "run"
    argv = [str(CONFIG), f"--save-folder={save}", f"--load_path={stage1}", f"--sequence-length={SEQ}"]
    assert core_train.main(["--check", *argv, f"--data-root={pydoc}"]) == 0
    capsys.readouterr()
    if data == "demo":
        args, says = (
            [f"--data-root={_data_with(tmp_path, 'demo', BASE_DIR / 'tokenizer.json')}"],
            ("is not the tokenizer of load_path="),
        )
    else:
        from olmo_core.data import TokenizerConfig

        dolma2 = TokenizerConfig.dolma2()
        args = [f"--data-root={_data_with(tmp_path, 'dolma2', pydoc / 'tokenizer.json')}"] + [
            f"--dataset.tokenizer.{key}={getattr(dolma2, key)}"
            for key in ("vocab_size", "eos_token_id", "pad_token_id", "identifier")
        ]
        says = "dataset.tokenizer.vocab_size=100278 does not fit model.vocab_size=49152"
    assert core_train.main(["--check", *argv, *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("core_train.py: error: ") and says in err, err
    assert not save.exists()


def _cross_entropy(model, windows: torch.Tensor) -> tuple[float, float, float]:
    """The mean next-token loss of `model` on `windows` [B, T] (every position but the last), max |logit| and max
    |position| of its RePo layers (0 without)."""
    with torch.no_grad(), record_positions(model) as positions:
        logits = model(windows)  # [B, T, V]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), windows[:, 1:].reshape(-1))
    max_pos = max((z.abs().max().item() for z in positions.values()), default=0.0)
    return loss.item(), logits.abs().max().item(), max_pos


@pytest.mark.long
def test_two_process_steps_from_the_stock_model_on_python_docs_and_back_to_hf(
    stage1, pydoc, tmp_path, smollm2_dir
):
    """The documented start (`scripts/core_train.py --nproc-per-node=2`, its checks first) trains 2 steps of one
    128-token window per rank from the stage-1 checkpoint. Losses finite; step 1's is the step-0 model's on the
    batch the data loader drew, recomputed here within the fp32 bound. Both it and the stock model's loss on that
    batch are below ln(V) / 2 = 5.4: a model that reads text in its own tokens predicts it e^5.4 ~ 220 times
    better than chance, while ids of another tokenizer (or shifted ids) read as noise, near ln(V) = 10.8 or
    above. The step-1 loss is not the stock model's: at init f_phi predicts positions ~0.005, so layers 9..29
    attend without positions (NoPE) until trained, +1.5 nats on this text (measured; docs/smollm2.md)."""
    save = tmp_path / "run"
    command = [
        sys.executable, str(ROOT / "scripts" / "core_train.py"), "--nproc-per-node=2", str(CONFIG),
        f"--save-folder={save}", f"--data-root={pydoc}", f"--load_path={stage1}", f"--sequence-length={SEQ}",
        f"--trainer.max_duration.value={STEPS}", f"--trainer.callbacks.checkpointer.save_interval={STEPS}",
        f"--data_loader.global_batch_size={WINDOWS * SEQ}", f"--train_module.rank_microbatch_size={SEQ}",
        "--trainer.callbacks.niah.enabled=false",
    ]  # fmt: skip
    _run(command, tmp_path / "run.log")
    logged = metrics(save)
    losses = {step: record["train/CE loss"] for step, record in logged.items() if "train/CE loss" in record}
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(map(math.isfinite, losses.values())), losses

    # The step-0 model: the stock model's tensors bit-exact, f_phi new in exactly layers 9..29 (two FSDP ranks).
    start, stock_model = checkpoint.load_model(save / "step0").eval(), checkpoint.load_model(stage1).eval()
    start_state, stock_state = checkpoint.state_dict(start), checkpoint.state_dict(stock_model)
    new = set(start_state) - set(stock_state)
    assert {f_phi_layer(k) for k in new} == set(REPO_LAYERS) and all(f_phi_layer(k) is not None for k in new)
    for name, tensor in stock_state.items():
        assert torch.equal(tensor, start_state[name]), name
    _assert_initialised({k: start_state[k] for k in new}, checkpoint.model_config(save / "step0").init_std)

    # Step 1's loss is the step-0 model's on the global batch the data loader drew (OLMo-core's saved order), in
    # fp32 up to the order of sums; the stock model reads the same windows as a pretrained model reads English.
    order = np.fromfile(next(save.glob("global_indices_*.npy")), dtype=np.uint32)
    ids = _ids(pydoc)
    windows = torch.tensor(np.stack([ids[i * SEQ : (i + 1) * SEQ] for i in order[:WINDOWS]]).astype(np.int64))
    recomputed, max_logit, max_pos = _cross_entropy(start, windows)
    stock_loss, _, _ = _cross_entropy(stock_model, windows)
    config = checkpoint.model_config(stage1)
    bound = logprob_bound(config.n_layers, config.block.feed_forward.hidden_size, max_logit, max_pos)
    assert abs(losses[1] - recomputed) <= bound, (losses[1], recomputed, bound)
    assert stock_loss < math.log(VOCAB) / 2 and losses[1] < math.log(VOCAB) / 2, (stock_loss, losses)
    print(f"step-1 loss {losses[1]:.4f} (recomputed {recomputed:.4f}), the stock model's {stock_loss:.4f}")

    # The last checkpoint as repo_llama (remote code): HF's logits are OLMo-core's in fp32.
    last = save / f"step{STEPS}"
    hf_dir = core_to_hf(last, tmp_path / "hf")
    assert _json(hf_dir / "config.json")["model_type"] == "repo_llama"
    # SmolLM2's config whole (8192 tokens, not the run's 128; its end id, its extra keys), the run's RePo keys over
    # it: no --max-position-embeddings needed (issue 51)
    run_keys = ("model_type", "architectures", "auto_map", *SCORED_PE_KEYS)
    converted, stock = _json(hf_dir / "config.json"), _json(smollm2_dir / "config.json")
    assert converted["max_position_embeddings"] == stock["max_position_embeddings"] == 8192
    assert (
        config_differences(stock, converted, {**HF_MAY_DIFFER, **dict.fromkeys(run_keys, "the run's")}) == {}
    )
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32).eval()
    trained = checkpoint.load_model(last).eval()
    with torch.no_grad(), record_positions(trained) as positions:
        expected = trained(windows)
    with torch.no_grad():
        got = hf(windows, output_positions=True)
    roundings = 2 * logit_roundings(checkpoint.model_config(last), SEQ)
    assert_within(got.logits, expected, roundings=roundings, what="logits")
    assert (
        sorted(got.positions) == sorted(positions) == REPO_LAYERS
    )  # positions ~0.005: the logits barely see f_phi
    for layer, z in positions.items():
        assert_within(got.positions[layer], z, roundings=roundings, what=f"positions of layer {layer}")
    f_phi = {k for k in checkpoint.state_dict(trained) if f_phi_layer(k) is not None}
    trained_state = checkpoint.state_dict(trained)
    assert any(not torch.equal(trained_state[k], start_state[k]) for k in f_phi)  # f_phi trained
