"""Qwen 3 0.6B (base) continued with RePo in layers 9..27 of 28: the paper's stage-2 recipe on a Qwen 3.

Source: the OLMo 2 1B stage-2 recipe of `OLMo-2-0425-1B-stage2-repo.py` (50B tokens at 4096, global batch 512 x
4096, micro-batch 4, AdamW (0.9, 0.95), lr 7.4487e-5 linear to 0 without warm-up, weight decay 0.1 except the
embeddings, z-loss 1e-5, clipping 1.0, bf16 FSDP, seed 42; Qwen published no recipe for continuing Qwen 3, so the
paper's values for its nearest model stand, to be tuned with overrides), with:
  - model: `Qwen/Qwen3-0.6B-Base`'s `config.json` (below, as published) through the converter's Qwen 3 table
    (`olmo_repo.olmocore.convert.family_config_from_hf`): exactly the model `scripts/core_convert_from_hf.py`
    makes of that checkpoint (per-head q/k RMSNorm before the rotation, head width 128 != 1024 / 16), with RePo
    from layer 9 (ceil(28 / 3) - 1);
  - data: `--data-root`, made with Qwen 3's own tokenizer (the project's OLMo 2 data is dolma2's, whose ids mean
    nothing to Qwen): the OLMo 2 stage-2 mix's text (`configs/data/olmo2-stage2-mix.yaml`: its sources and
    shares, where to download it) by `scripts/prepare_data.py --mix` (OLMo-core's source mixture of its
    `mix.json`), a data folder of `prepare_data.py`, or `scripts/tokenize_text.py`'s `train.npy` (docs/data.md).

    .venv-core/bin/python scripts/core_convert_from_hf.py --input /models/Qwen3-0.6B-Base --output /ckpt/qwen-stage1
    .venv-data/bin/python scripts/prepare_data.py --model /models/Qwen3-0.6B-Base --mix configs/data/olmo2-stage2-mix.yaml --output /data/qwen3-stage2
    .venv-core/bin/python scripts/core_train.py configs/olmocore/Qwen3-0.6B-Base-repo.py --nproc-per-node=8 \\
        --save-folder=/ckpt/qwen3-repo --data-root=/data/qwen3-stage2 --load_path=/ckpt/qwen-stage1
"""

import argparse
from pathlib import Path

from olmo_core.script_utils import ExperimentConfig
from transformers import Qwen3Config

from olmo_repo.olmocore import with_position_modes
from olmo_repo.olmocore.convert import family_config_from_hf
from olmo_repo.olmocore.families import QWEN3
from olmo_repo.olmocore.train import load_build_config, on_tokenized_text

RECIPE = load_build_config(Path(__file__).with_name("OLMo-2-0425-1B-stage2-repo.py"))
PE_START_LAYER = 9

# Qwen/Qwen3-0.6B-Base, config.json (the keys that shape the model).
HF_CONFIG = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
    attention_bias=False,
    use_sliding_window=False,
    sliding_window=None,
    max_window_layers=28,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151643,
)


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    hf = Qwen3Config(**HF_CONFIG)
    config = on_tokenized_text(RECIPE(opts, []), hf, opts.data_root)
    config.model = with_position_modes(
        family_config_from_hf(QWEN3, hf), "repo", pe_start_layer=PE_START_LAYER
    )
    return config.merge(overrides)
