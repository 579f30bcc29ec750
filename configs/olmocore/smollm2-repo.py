"""SmolLM2-135M-Instruct (Q4_1 dequantised) continued with RePo in layers 9..29 of 30, on CPU: a real pretrained
model through the whole pipeline in minutes.

Source: `tiny-stage2-repo.py` (the demo's stage 2 at CPU scale: two gloo processes with FSDP in fp32, a linear
schedule to 0 without warm-up, AdamW (0.9, 0.95) with weight decay 0.1 except the embeddings, z-loss 1e-5,
clipping 1.0, metrics every step), with:
  - model: the `config.json` that `scripts/smollm2.py` writes (below: SmolLM2-135M-Instruct as its GGUF states it,
    rms_norm_eps the float32 value the GGUF stores) through the converter's Llama table
    (`olmo_repo.olmocore.convert.family_config_from_hf`): exactly the model `scripts/core_convert_from_hf.py`
    makes of that directory, with RePo from layer 9 (ceil(30 / 3) - 1);
  - the paper's OLMo 2 1B stage-2 learning rate (7.4487e-5) and AdamW eps (1e-8), as `Llama-3.2-1B-repo.py`: a
    pretrained model, not the tiny one's 3e-3;
  - data: `--data-root`'s `train.npy` and `tokenizer.json`, made with SmolLM2's own tokenizer by
    `scripts/tokenize_text.py` (by default Python's documentation, ~113k tokens: one pass is ~110 steps of
    4 x 256 tokens), each document ended by the model's end id, `<|im_end|>` (2), which its config.json states and
    `core_convert_from_hf.py` records (SmolLM2's tokenizer: vocabulary 49152, `<|endoftext|>` 0, `<|im_start|>`
    1, `<|im_end|>` 2; the data-tokenizer check compares these with the checkpoint's before step 0);
  - 256-token windows, 4 per step (one micro-batch of 2 per rank), 100 steps, checkpoints every 50;
  - in-loop NIAH off: RULER's multi-key prompts need about 285 tokens or more. With `--sequence-length=512
    --trainer.callbacks.niah.enabled=true` it scores SmolLM2's own haystacks at the start and the end.
  - the paper's RePo: no index blend, one learning rate and weight decay for every weight. Issue 48's knobs are
    overrides: `--model.block.sequence_mixer.pe_blend_init=1.0 --model.block.sequence_mixer.pe_blend_steps=100`
    starts the RePo layers as the RoPE layers they replace and hands over to f_phi over the 100 steps;
    `--f_phi.lr_multiplier=10` (and `--f_phi.weight_decay=...`) gives f_phi its own; `--f_phi.only=true` trains
    f_phi alone (docs/configuration.md).

    .venv-core/bin/python scripts/smollm2.py --output runs/smollm2-135m
    .venv-core/bin/python scripts/core_convert_from_hf.py --input runs/smollm2-135m --output runs/core/smollm2
    .venv-core/bin/python scripts/tokenize_text.py --model runs/smollm2-135m --output runs/smollm2-pydoc
    .venv-core/bin/python scripts/core_train.py configs/olmocore/smollm2-repo.py --nproc-per-node=2 \\
        --save-folder=runs/core/smollm2-repo --data-root=runs/smollm2-pydoc --load_path=runs/core/smollm2
"""

import argparse
from pathlib import Path

from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import Duration
from transformers import LlamaConfig

from olmo_repo.olmocore import with_position_modes
from olmo_repo.olmocore.convert import LLAMA, family_config_from_hf
from olmo_repo.olmocore.train import load_build_config, on_tokenized_text

TINY = load_build_config(Path(__file__).with_name("tiny-stage2-repo.py"))
PE_START_LAYER = 9
SEQUENCE_LENGTH = 256
WINDOWS = 4  # per step
LR = 0.000074487
STEPS = 100

# SmolLM2-135M-Instruct's config.json as scripts/smollm2.py writes it (the keys that shape the model).
HF_CONFIG = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=8192,
    rms_norm_eps=9.999999747378752e-06,
    rope_parameters=dict(rope_type="default", rope_theta=100000.0),
    attention_bias=False,
    mlp_bias=False,
    tie_word_embeddings=True,
    initializer_range=0.02,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def build_config(opts: argparse.Namespace, overrides: list[str]) -> ExperimentConfig:
    sequence_length = opts.sequence_length or SEQUENCE_LENGTH
    config = TINY(argparse.Namespace(**{**vars(opts), "sequence_length": sequence_length}), [])
    hf = LlamaConfig(**HF_CONFIG)
    config = on_tokenized_text(config, hf, opts.data_root)
    config.model = with_position_modes(
        family_config_from_hf(LLAMA, hf), "repo", pe_start_layer=PE_START_LAYER
    )
    config.data_loader.global_batch_size = WINDOWS * sequence_length
    config.train_module.optim.lr = LR
    config.train_module.optim.eps = 1e-8
    config.trainer.max_duration = Duration.steps(STEPS)
    config.trainer.callbacks["checkpointer"].save_interval = 50
    niah = config.trainer.callbacks["niah"]
    niah.eval_interval, niah.enabled = STEPS, False
    return config.merge(overrides)
