"""OLMo 2 1B stage 2 with RePo in layers 5..15 of 16, expressed for OLMo-core: the paper's recipe.

Source: the released ai2-olmo config `configs/official-0425/OLMo2-1B-stage2-seed42.yaml`
(`configs/released/OLMo2-1B-stage2-seed42.yaml` here, whose `data.paths` this file reads: the same numpy token
files of the stage-2 mix), with OLMo-core's own pieces for each of its settings:
  - model: `TransformerConfig.olmo2_1B_v2` ("matches the OLMo 1B from the old OLMo trainer") with
    `with_position_modes(..., "repo", pe_start_layer=5)`;
  - 50B tokens at 4096 (`max_duration: 50e9T`, `stop_at: 23852` as `hard_stop`), global batch 512 x 4096, micro-batch
    4, AdamW (0.9, 0.95), eps 1e-8, lr 7.4487e-5 linear to 0 without warm-up, weight decay 0.1 except embeddings,
    z-loss 1e-5, gradient clipping 1.0, FSDP with bf16 parameters and fp32 reductions, seed 42;
  - the stage-1 start (`load_path`): an OLMo-core checkpoint of the stage-1 model (`peteish1/step1907359`), e.g.
    its HF revision of allenai/OLMo-2-0425-1B converted with `scripts/core_convert_from_hf.py` (model only: the
    optimizer then starts fresh; the released recipe continues it, which needs an OLMo-core checkpoint with it).
`--data-root=DIR` reads the files under DIR instead of http://olmo-data.org (a local copy of that site).

    torchrun --nproc-per-node=4 scripts/core_train.py configs/olmocore/OLMo-2-0425-1B-stage2-repo.py \\
        --save-folder=/checkpoints/olmo2-1b-repo --load_path=/checkpoints/olmo2-1b-stage1-core
"""

import argparse
from pathlib import Path

import yaml
from olmo_core.config import DType
from olmo_core.data import NumpyDataLoaderConfig, NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig, LinearWithWarmup, OptimGroupOverride
from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import CheckpointerCallback, ConfigSaverCallback, WandBCallback
from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig

from olmo_repo.olmocore import NiahCallbackConfig, with_position_modes
from olmo_repo.olmocore.train import RepoExperimentConfig

RELEASED = Path(__file__).resolve().parents[1] / "released" / "OLMo2-1B-stage2-seed42.yaml"
SITE = "http://olmo-data.org"
SEQUENCE_LENGTH = 4096
GLOBAL_BATCH_SIZE = 512 * SEQUENCE_LENGTH
MAX_TOKENS = 50_000_000_000
STOP_AT = 23852  # round(50e9 / (512 * 4096)) + 10, the released stop_at
LR = 0.000074487
SEED = 42
PE_START_LAYER = 5


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    tokenizer_config = TokenizerConfig.dolma2()
    model_config = TransformerConfig.olmo2_1B_v2(vocab_size=tokenizer_config.padded_vocab_size())
    model_config = with_position_modes(model_config, "repo", pe_start_layer=PE_START_LAYER)

    root = opts.data_root.rstrip("/")
    paths = [p.replace(SITE, root, 1) for p in yaml.safe_load(RELEASED.read_text())["data"]["paths"]]
    dataset_config = NumpyFSLDatasetConfig(
        paths=paths,
        sequence_length=SEQUENCE_LENGTH,
        tokenizer=tokenizer_config,
        dtype=NumpyDatasetDType.uint32,
        work_dir=opts.work_dir,
    )
    data_loader_config = NumpyDataLoaderConfig(global_batch_size=GLOBAL_BATCH_SIZE, seed=SEED, num_workers=8)

    train_module_config = TransformerTrainModuleConfig(
        rank_microbatch_size=4 * SEQUENCE_LENGTH,
        max_sequence_length=SEQUENCE_LENGTH,
        optim=AdamWConfig(
            lr=LR,
            weight_decay=0.1,
            eps=1e-8,
            betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
        ),
        scheduler=LinearWithWarmup(warmup=0, alpha_f=0.0),
        dp_config=TransformerDataParallelConfig(
            name=DataParallelType.fsdp, param_dtype=DType.bfloat16, reduce_dtype=DType.float32
        ),
        z_loss_multiplier=1e-5,
        max_grad_norm=1.0,
    )

    trainer_config = (
        TrainerConfig(
            save_folder=opts.save_folder,
            save_overwrite=True,
            max_duration=Duration.tokens(MAX_TOKENS),
            hard_stop=Duration.steps(STOP_AT),
            work_dir=opts.work_dir,
        )
        .with_callback("config_saver", ConfigSaverCallback())
        .with_callback(
            "checkpointer",
            CheckpointerCallback(save_interval=1000, ephemeral_save_interval=250, save_async=False),
        )
        .with_callback("niah", NiahCallbackConfig(tokenizer=tokenizer_config, eval_interval=1000))
        .with_callback(
            "wandb", WandBCallback(name=opts.name, enabled=False)
        )  # NOTE: change to true to enable
    )

    return RepoExperimentConfig(  # with the `f_phi` section (the paper's: one lr, one weight decay)
        model=model_config,
        dataset=dataset_config,
        data_loader=data_loader_config,
        train_module=train_module_config,
        trainer=trainer_config,
        init_seed=SEED,
    ).merge(overrides)
