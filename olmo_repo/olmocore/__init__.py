"""RePo on OLMo-core 3 (`ai2-olmo-core` 3.0.0, in its own environment `.venv-core`: ai2-olmo pins OLMo-core 0.1.0).

Imports OLMo-core, transformers and the RePo core (`olmo_repo.rope`, `olmo_repo.modes`), never ai2-olmo.

    attention    RepoAttentionConfig (SequenceMixerConfig "repo"), with_position_modes(preset, ...)
    convert      OLMo-core <-> HF configs and weights: one mechanism over the family tables, OLMo-core's converters
    families     the HF family tables (Olmo 2, Olmo 3, Llama, Qwen 3): a Row per HF key, read both ways
    checkpoint   OLMo-core checkpoints: config.json, model-only checkpoints, load_model
    hf           core_to_hf / hf_to_core (checkpoint directories <-> HF directories)
    stage1       strict stage-1 initialisation (base bit-exact, RePo weights new, optimizer state continued)
    niah         in-loop RULER NIAH as an OLMo-core evaluator callback
    train        the run: OLMo-core's TransformerTrainModule and Trainer from a config in configs/olmocore/
"""

from .attention import RepoAttention, RepoAttentionConfig, with_position_modes
from .niah import NiahCallbackConfig

__all__ = ["NiahCallbackConfig", "RepoAttention", "RepoAttentionConfig", "with_position_modes"]
