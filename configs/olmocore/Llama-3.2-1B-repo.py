"""Llama 3.2 1B continued with RePo in layers 5..15 of 16: the paper's stage-2 recipe on a Llama.

Source: the OLMo 2 1B stage-2 recipe of `OLMo-2-0425-1B-stage2-repo.py` (50B tokens at 4096, global batch 512 x
4096, micro-batch 4, AdamW (0.9, 0.95), lr 7.4487e-5 linear to 0 without warm-up, weight decay 0.1 except the
embeddings, z-loss 1e-5, clipping 1.0, bf16 FSDP, seed 42; Meta published no recipe for continuing Llama 3.2, so
the paper's OLMo 2 1B values stand, to be tuned with overrides), with:
  - model: `meta-llama/Llama-3.2-1B`'s `config.json` (below, as published) through the converter's Llama table
    (`olmo_repo.olmocore.convert.family_config_from_hf`): exactly the model `scripts/core_convert_from_hf.py`
    makes of that checkpoint, Llama 3's RoPE scaling included, with RePo from layer 5 (ceil(16 / 3) - 1);
  - data: `--data-root`, made with Llama 3's own tokenizer (the project's OLMo 2 data is dolma2's, whose ids mean
    nothing to Llama): the OLMo 2 stage-2 mix's text (`configs/data/olmo2-stage2-mix.yaml`: its sources and
    shares, where to download it) by `scripts/prepare_data.py --mix` (OLMo-core's source mixture of its
    `mix.json`), a data folder of `prepare_data.py`, or `scripts/tokenize_text.py`'s `train.npy` (docs/data.md).

    .venv-core/bin/python scripts/core_convert_from_hf.py --input /models/Llama-3.2-1B --output /ckpt/llama-stage1
    .venv-data/bin/python scripts/prepare_data.py --model /models/Llama-3.2-1B --mix configs/data/olmo2-stage2-mix.yaml --output /data/llama3-stage2
    .venv-core/bin/python scripts/core_train.py configs/olmocore/Llama-3.2-1B-repo.py --nproc-per-node=8 \\
        --save-folder=/ckpt/llama-1b-repo --data-root=/data/llama3-stage2 --load_path=/ckpt/llama-stage1
"""

import argparse
from pathlib import Path

from olmo_core.script_utils import ExperimentConfig
from transformers import LlamaConfig

from olmo_repo.olmocore import with_position_modes
from olmo_repo.olmocore.convert import family_config_from_hf
from olmo_repo.olmocore.families import LLAMA
from olmo_repo.olmocore.train import load_build_config, on_tokenized_text

RECIPE = load_build_config(Path(__file__).with_name("OLMo-2-0425-1B-stage2-repo.py"))
PE_START_LAYER = 5

# meta-llama/Llama-3.2-1B, config.json (the keys that shape the model).
HF_CONFIG = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
    attention_bias=False,
    mlp_bias=False,
    tie_word_embeddings=True,
    bos_token_id=128000,
    eos_token_id=128001,
)


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    hf = LlamaConfig(**HF_CONFIG)
    config = on_tokenized_text(RECIPE(opts, []), hf, opts.data_root)
    config.model = with_position_modes(
        family_config_from_hf(LLAMA, hf), "repo", pe_start_layer=PE_START_LAYER
    )
    return config.merge(overrides)
