"""Run by .venv/bin/python (ai2-olmo 0.6.0) from tests/core/test_parity_olmo.py: an ai2-olmo RePo model (GQA when
asked), saved as this project's unsharded checkpoint and converted to HF by the ai2-olmo side's converter, with
its fp32 logits and positions on fixed inputs.

    .venv/bin/python tests/core/olmo_reference.py OUT_DIR TOKENIZER_JSON N_KV_HEADS
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from olmo_repo import RepoTrainConfig, build_model, olmo2_model_config, predict_positions, repo_blocks
from olmo_repo.ai2olmo.hf import convert_to_hf


def main(out: Path, tokenizer: str, n_kv_heads: int) -> None:
    torch.manual_seed(0)
    config = olmo2_model_config(
        d_model=64, n_heads=4, n_kv_heads=n_kv_heads, n_layers=4, mlp_ratio=4, max_sequence_length=64,
        vocab_size=4096, embedding_size=4096, eos_token_id=0, pad_token_id=1, init_device="cpu",
        pe_mode="repo", pe_start_layer=1,
    )  # fmt: skip
    model = build_model(config)
    model.reset_parameters()
    with torch.no_grad():  # OLMo's init predicts positions ~1e-4: widen them so that the rotation matters
        for block in repo_blocks(model):
            block.final_map.weight.mul_(3000.0)
    model.eval()
    ckpt = out / "olmo"
    ckpt.mkdir(parents=True)
    train_config = RepoTrainConfig(model=config)
    train_config.tokenizer.identifier = tokenizer
    train_config.save(ckpt / "config.yaml")
    torch.save(model.state_dict(), ckpt / "model.pt")
    convert_to_hf(ckpt, out / "hf")
    ids = torch.randint(2, 4096, (2, 24))
    with torch.no_grad():
        logits = model(ids).logits
        positions = predict_positions(model, ids)
    torch.save({"ids": ids, "logits": logits, "positions": positions}, out / "reference.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
