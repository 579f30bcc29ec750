"""RePo on ai2-olmo 0.6.0 (the paper's OLMo-2 recipe, in the environment `.venv`), the same files in the same
places as `olmo_repo.olmocore` (OLMo-core 3) where the job is the same.

Imports ai2-olmo, transformers and the rule set below it (`olmo_repo.modes`, `olmo_repo.fit`, `olmo_repo.rope`),
never OLMo-core 3. Fixes to ai2-olmo 0.6.0 on current torch, and every ai2-olmo internal touched, are
`olmo_repo.upstream.olmo` and `olmo_repo.upstream.torch`.

    config       RepoModelConfig / RepoTrainConfig: OLMo's dataclasses + the pe_* keys (and the reference's), f_phi
    block        RepoSequentialBlock: OLMo's sequential block with the RePo layer; predict_positions
    registry     install(): OLMo's block factory builds RePo/NoPE blocks from the config; build_model
    convert      OLMo <-> HF configs and weight names (the Olmo 2 shape: `olmo2` / `repo_olmo2`)
    checkpoint   unsharded OLMo checkpoints of this project: load_model
    unshard      a run's sharded checkpoint -> an unsharded one
    hf           convert_to_hf / convert_from_hf (checkpoint directories <-> HF directories)
    stage1       RepoCheckpointer: strict stage-1 initialisation (the fit rule of `olmo_repo.fit`)
    niah         in-loop RULER NIAH as an OLMo evaluator
    train        the run: process group, wrap, build_trainer, run, train (scripts/train.py)
    trainer      RepoTrainer: OLMo's Trainer + the index blend, f_phi's param group, positions, metrics.jsonl,
                 the SIGUSR1 stop
    preflight    checks before anything is written
    run_folder   the run folder across starts: resume, config changes, metrics.jsonl, data indices

Importing this package loads nothing; `import olmo_repo` reaches the public names (`RepoTrainConfig`,
`build_model`, ...) lazily.
"""
