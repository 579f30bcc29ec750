"""RePo on OLMo-core 3 (`ai2-olmo-core` 3.0.0, its own environment `.venv-core`: ai2-olmo pins OLMo-core 0.1.0).

Imports OLMo-core and the RePo core (`olmo_repo.rope`, `olmo_repo.modes`), never ai2-olmo.
"""
