"""Tiny RePo stage 2 on CPU with OLMo-core: the demo's base model and corpus, RePo in layers 1-3 of 4.

Source: `olmo_repo/experiments/demo/configs/tiny-stage2-repo.yaml` (the ai2-olmo demo's stage 2: the official stage-2 recipe
at tiny scale), in OLMo-core's style. The model is the shipped base model's (`olmo_repo/experiments/demo/base_model`, HF),
converted to a model-only OLMo-core checkpoint; the corpus is `make demo`'s (`runs/demo/data`):

    .venv-core/bin/python scripts/core_convert_from_hf.py --input olmo_repo/experiments/demo/base_model --output runs/core/base
    .venv-core/bin/torchrun --nproc-per-node=2 scripts/core_train.py configs/olmocore/tiny-stage2-repo.py \\
        --save-folder=runs/core/tiny-repo --data-root=runs/demo/data --load_path=runs/core/base

Two CPU processes train with FSDP on gloo; rerunning the command resumes from the latest checkpoint.
"""

import argparse

from olmo_core.config import DType
from olmo_core.data import NumpyDataLoaderConfig, NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from olmo_core.optim import AdamWConfig, LinearWithWarmup, OptimGroupOverride
from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import CheckpointerCallback, ConfigSaverCallback, WandBCallback
from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig

from olmo_repo.olmocore import NiahCallbackConfig, with_position_modes
from olmo_repo.olmocore.train import RepoExperimentConfig

SEQUENCE_LENGTH = 512
GLOBAL_BATCH_SIZE = 8 * SEQUENCE_LENGTH  # 8 windows of the corpus per step, as the demo
LR = 3.0e-3  # the base's peak, as the demo's stage 2
STEPS = 200
SEED = 6198


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    sequence_length = opts.sequence_length or SEQUENCE_LENGTH
    tokenizer_config = TokenizerConfig(
        vocab_size=4096, eos_token_id=0, pad_token_id=1, identifier=f"{opts.data_root}/tokenizer.json"
    )
    model_config = TransformerConfig.llama_like(  # the base model's shape: OLMo 2 blocks, tied embeddings
        d_model=128,
        vocab_size=tokenizer_config.vocab_size,
        n_layers=4,
        n_heads=4,
        block_name=TransformerBlockType.reordered_norm,
        qk_norm=True,
        rope_theta=500_000,
        layer_norm_eps=1e-6,
        feed_forward=FeedForwardConfig(hidden_size=512, bias=False),
        tie_word_embeddings=True,
    )
    model_config = with_position_modes(model_config, "repo", pe_start_layer=1)

    dataset_config = NumpyFSLDatasetConfig(
        paths=[f"{opts.data_root}/stage2.npy"],
        sequence_length=sequence_length,
        tokenizer=tokenizer_config,
        dtype=NumpyDatasetDType.uint32,
        work_dir=opts.work_dir,
    )
    data_loader_config = NumpyDataLoaderConfig(global_batch_size=GLOBAL_BATCH_SIZE, seed=SEED, num_workers=0)

    train_module_config = TransformerTrainModuleConfig(
        rank_microbatch_size=2 * sequence_length,
        max_sequence_length=sequence_length,
        optim=AdamWConfig(
            lr=LR,
            weight_decay=0.1,
            betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
        ),
        scheduler=LinearWithWarmup(warmup=0, alpha_f=0.0),
        dp_config=TransformerDataParallelConfig(
            name=DataParallelType.fsdp, param_dtype=DType.float32, reduce_dtype=DType.float32
        ),
        z_loss_multiplier=1e-5,
        max_grad_norm=1.0,
    )

    trainer_config = (
        TrainerConfig(
            save_folder=opts.save_folder,
            save_overwrite=True,
            max_duration=Duration.steps(STEPS),
            metrics_collect_interval=1,
            cancel_check_interval=1,
            work_dir=opts.work_dir,
        )
        .with_callback("config_saver", ConfigSaverCallback())
        .with_callback(
            "checkpointer",
            CheckpointerCallback(save_interval=50, ephemeral_save_interval=None, save_async=False),
        )
        .with_callback(
            "niah",
            NiahCallbackConfig(
                tokenizer=tokenizer_config, prompts=10, eval_interval=50, eval_on_startup=True
            ),
        )
        .with_callback("wandb", WandBCallback(name=opts.name, enabled=False))  # NOTE: set enabled=True to log
    )

    return RepoExperimentConfig(  # with the `f_phi` section (the paper's: one lr, one weight decay)
        model=model_config,
        dataset=dataset_config,
        data_loader=data_loader_config,
        train_module=train_module_config,
        trainer=trainer_config,
        init_seed=SEED,
    ).merge(overrides)
