"""Tiny RePo continual pre-training of a Llama 3-shaped model on CPU with OLMo-core: what the tests run.

Source: `tiny-stage2-repo.py` (the demo's stage 2 at tiny scale: data, optimizer, schedule, checkpoints, in-loop
NIAH), with its model replaced by a Llama 3-shaped one (`TransformerConfig.llama_like`, as OLMo-core's `llama3_1B`
preset builds it): pre-norm blocks (`default`: f_phi reads the normed hidden state, what q, k and v read), no q/k
norm, grouped-query attention (4 query heads per 2 key/value heads, one position per key/value head), SwiGLU, tied
embeddings, RePo from layer 1 of 4 (ceil(4 / 3) - 1). The data and the stage-1 start use the demo's tokenizer, this
tiny model's own: a stage-1 checkpoint is the same model with `pe_mode=rope`. `--data-root` is the demo's data
(`stage2.npy`) or a data folder or mix of `scripts/prepare_data.py` made with the demo's tokenizer
(`olmo_repo.olmocore.train.on_data_root`).

    .venv-core/bin/python scripts/core_train.py configs/olmocore/tiny-llama3-repo.py --nproc-per-node=2 \\
        --save-folder=runs/core/tiny-llama3 --data-root=runs/demo/data --load_path=STAGE1
"""

import argparse
from pathlib import Path

from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.script_utils import ExperimentConfig

from olmo_repo.olmocore import with_position_modes
from olmo_repo.olmocore.train import load_build_config, on_data_root

TINY = load_build_config(Path(__file__).with_name("tiny-stage2-repo.py"))


def model() -> TransformerConfig:
    """The tiny Llama 3 with RoPE in every layer (a stage-1 model)."""
    return TransformerConfig.llama_like(
        d_model=128,
        vocab_size=4096,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        rope_theta=500_000,
        layer_norm_eps=1e-5,
        feed_forward=FeedForwardConfig(hidden_size=384, bias=False),
        tie_word_embeddings=True,
    )


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    config = on_data_root(TINY(opts, []), opts.data_root, default="stage2.npy")
    config.model = with_position_modes(model(), "repo", pe_start_layer=1)
    return config.merge(overrides)
