# The two set-up commands of the README: `make demo` (main job) and `make test` (the suite).
# Both build .venv first, torch 2.13.0 before everything else so that no dependency pulls another torch.
# `make install CPU=1` takes torch from PyTorch's CPU wheel index: PyPI's Linux wheel is the multi-GB CUDA
# build (a machine whose pip already finds a CPU wheel, e.g. in a local wheel folder, needs no switch).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CPU ?=
TORCH_INDEX := $(if $(CPU),--index-url https://download.pytorch.org/whl/cpu)

# System packages that some tests use (COMMAND:DEBIAN_PACKAGE), installed by `make test` when missing.
SYSTEM_DEPS := chromium:chromium munged:munge slurmctld:slurm-wlm slurmd:slurm-wlm sbatch:slurm-wlm

.PHONY: install system-deps test test-fast lint demo demo-base bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0 $(TORCH_INDEX)
	$(BIN)/pip install -e '.[dev,eval,explore]'
	touch $@

system-deps:
	@bash tests/system-deps.sh $(SYSTEM_DEPS)

test: install system-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# The tests not marked slow (no training runs, subprocess launches, SLURM, browser or lm-eval): under 2 min.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: install
	$(BIN)/python scripts/demo.py

# Rebuild the base model that `make demo` starts from (olmo_repo/demo/base_model/, shipped): about 55 min on 2 cores.
demo-base: install
	$(BIN)/python scripts/demo_base.py

# RePo vs RoPE vs NoPE side by side (CPU size here; `--size gpu-1b` on a GPU machine). See bench/RESULTS.md.
bench: install
	$(BIN)/python bench/bench_repo.py --size cpu --json bench/last-cpu.json

clean:
	rm -rf $(VENV) runs
