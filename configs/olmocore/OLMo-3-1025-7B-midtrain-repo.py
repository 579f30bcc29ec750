"""OLMo 3 7B mid-training with RePo in layers 10..31 of 32 (OLMo-core).

Source: OLMo-core's official `src/scripts/official/OLMo3/OLMo-3-1025-7B-midtrain.py` (OLMo-3-1025-7B, stage 2:
100B tokens of the mid-training mix at 8192 tokens from the stage-1 checkpoint, its optimizer state continued).
Unchanged except:
  - the attention: `with_position_modes(..., "repo", pe_start_layer=10)` (the paper's 7B rule: RePo from the
    ceil(32/3)-th layer, counting from one); OLMo 3's sliding-window pattern stays on every layer;
  - the data mix: `DataMix.OLMo_midtraining_mix_0625_100B`, the mid-training mix that ai2-olmo-core 3.0.0 ships;
  - the stage-1 optimizer state continues per parameter (the RePo weights start fresh) and the hyper-parameters
    are this file's (`olmo_repo.olmocore.stage1`): LR is the official script's.

    torchrun --nproc-per-node=8 scripts/core_train.py configs/olmocore/OLMo-3-1025-7B-midtrain-repo.py \\
        --save-folder=/checkpoints/olmo3-7b-repo --data-root=/data/ai2-llm
"""

import argparse

from olmo_core.config import DType
from olmo_core.data import DataMix, NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.float8 import Float8Config
from olmo_core.nn.attention import AttentionBackendName
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.nn.transformer.config import TransformerActivationCheckpointingMode
from olmo_core.optim import LinearWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import CheckpointerCallback, ConfigSaverCallback, WandBCallback
from olmo_core.train.common import LoadStrategy
from olmo_core.train.train_module import (
    TransformerDataParallelConfig,
    TransformerDataParallelWrappingStrategy,
    TransformerTrainModuleConfig,
)
from olmo_core.train.train_module.transformer.config import TransformerActivationCheckpointingConfig

from olmo_repo.olmocore import NiahCallbackConfig, with_position_modes
from olmo_repo.olmocore.train import RepoExperimentConfig

DEFAULT_SEQUENCE_LENGTH = 8192
GLOBAL_BATCH_SIZE = 2**21  # ~2M tokens
MAX_TOKENS = 100_000_000_000  # 100B
LR = 0.00020712352850360292
SEED = 1337
STAGE1 = "https://olmo-checkpoints.org/ai2-llm/Olmo-3-1025-7B/stage1/step1413814/"
PE_START_LAYER = 10


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    sequence_length = opts.sequence_length or DEFAULT_SEQUENCE_LENGTH
    tokenizer_config = TokenizerConfig.dolma2()

    model_config = TransformerConfig.olmo3_7B(
        vocab_size=tokenizer_config.padded_vocab_size(),  # pad to a multiple of 128
        attn_backend=AttentionBackendName.flash_2,
    )
    model_config = with_position_modes(model_config, "repo", pe_start_layer=PE_START_LAYER)

    dataset_config = NumpyFSLDatasetConfig.from_data_mix(
        mix=DataMix.OLMo_midtraining_mix_0625_100B,
        tokenizer=tokenizer_config,
        mix_base_dir=opts.data_root,
        sequence_length=sequence_length,
        max_target_sequence_length=max(8192, sequence_length),
        work_dir=opts.work_dir,
    )
    data_loader_config = NumpyDataLoaderConfig(global_batch_size=GLOBAL_BATCH_SIZE, seed=SEED, num_workers=4)

    train_module_config = TransformerTrainModuleConfig(
        rank_microbatch_size=2 * 8192,
        max_sequence_length=sequence_length,
        optim=SkipStepAdamWConfig(
            lr=LR,
            weight_decay=0.1,
            betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
        ),
        scheduler=LinearWithWarmup(warmup=0, alpha_f=0.0),
        compile_model=True,
        dp_config=TransformerDataParallelConfig(
            name=DataParallelType.hsdp,
            param_dtype=DType.bfloat16,
            reduce_dtype=DType.float32,
            wrapping_strategy=TransformerDataParallelWrappingStrategy.blocks,
        ),
        ac_config=TransformerActivationCheckpointingConfig(
            mode=TransformerActivationCheckpointingMode.selected_modules, modules=["blocks.*.feed_forward"]
        ),
        float8_config=Float8Config(enabled=False),
        z_loss_multiplier=1e-5,
        max_grad_norm=1.0,
    )

    trainer_config = (
        TrainerConfig(
            save_folder=opts.save_folder,
            save_overwrite=True,
            load_strategy=LoadStrategy.if_available,  # the stage-1 start is this project's strict one
            max_duration=Duration.tokens(MAX_TOKENS),
            work_dir=opts.work_dir,
        )
        .with_callback("config_saver", ConfigSaverCallback())
        .with_callback(
            "checkpointer",
            CheckpointerCallback(save_interval=1000, ephemeral_save_interval=100, save_async=False),
        )
        .with_callback("niah", NiahCallbackConfig(tokenizer=tokenizer_config, eval_interval=1000))
        .with_callback(
            "wandb", WandBCallback(name=opts.name, cancel_check_interval=10, enabled=False)
        )  # NOTE: change to true to enable
    )

    return RepoExperimentConfig(  # with the `f_phi` section (the paper's: one lr, one weight decay)
        model=model_config,
        dataset=dataset_config,
        data_loader=data_loader_config,
        train_module=train_module_config,
        trainer=trainer_config,
        init_seed=SEED,
        load_path=STAGE1,
    ).merge(overrides)
