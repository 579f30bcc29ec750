#!/usr/bin/env bash
# The GPU checks of the project in one run: the GPU tests, then the benchmark at the full 1B shape.
#
#   bash bench/gpu_check.sh wheels      # on a machine with PyPI: fetch the packages a bare GPU image lacks into .whl/
#   bash bench/gpu_check.sh             # on the GPU machine (python3 with CUDA torch): install .whl/, run
#
# Copy the repository with .whl/ to the GPU machine in between if it has no PyPI. At most ~9 minutes on one H200
# (each part has a time limit). FSDP itself runs in the CPU suite (gloo); this run covers what only a GPU has.
# ai2-olmo side, tests/test_train_gpu.py: nccl with FSDP and CUDA autocast (amp_bf16) through scripts/train.py,
# flash-attn (when the image has it: it is built against the image's torch, so no wheel travels), the bf16 GEMMs
# of f_phi, torch.compile of the rotation on CUDA; then `bench_repo.py --size gpu-1b,gpu-1b-gqa --profile`.
# OLMo-core side, tests/core/test_train_gpu.py (nccl, FSDP with bf16 parameters), then
# `bench_core.py --size gpu-1b`. vLLM's 1B case where the image has vllm.
#
# Results go to $OUT (default ./gpu-out): tests.log, bench.log, bench-gpu.json, tests-core.log, bench-core.log.
# The image is assumed to hold torch, numpy, pandas, pyarrow, scikit-learn, torchmetrics and pytest already;
# transformers and everything else ai2-olmo imports at module level travel as wheels, pinned to the versions the
# CPU suite tests.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  ai2-olmo==0.6.0 ai2-olmo-core==0.1.0 omegaconf==2.3.0 boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3
  jmespath==1.1.0 cached_path==1.8.10 google-cloud-storage==3.17.1 google-cloud-core==2.8.0
  google-api-core==2.44.0 google-auth==2.63.0 google-crc32c==1.9.0 google-resumable-media==2.11.0
  googleapis-common-protos==1.76.0 proto-plus==1.29.0 pyasn1==0.6.5 pyasn1_modules==0.4.2 cryptography==50.0.2
  cffi==2.1.1 pycparser==3.12 datasets==3.6.0 dill==0.3.8 multiprocess==0.70.16 importlib_resources==7.1.0
  wandb==0.31.0 cwevals==0.0.1b1 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 platformdirs==4.14.8 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2 transformers==5.24.0
)
# OLMo-core 3 for bench_core.py, in a folder of its own (.whl/core/): ai2-olmo above pins olmo-core 0.1.0.
CORE_WHEELS=(ai2-olmo-core==3.0.0 bettermap==1.3.1 dataclass-extensions==0.5.0)

if [[ "${1:-}" == "wheels" ]]; then
  mkdir -p .whl
  platforms=()
  for n in 28 27 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl/core "${CORE_WHEELS[@]}"
  python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # published as a source archive only
  # To fit the 64 MiB that travels to the device, drop what the checks never read: ai2-olmo's evaluation data
  # (its wheel is 145 MB) and wandb's service binaries (19 MB; olmo.train imports wandb, the configs log no run).
  python3 - <<'PY'
import glob, zipfile
for pattern, skip in ((".whl/ai2_olmo-*.whl", ("olmo_data/oe_eval_tasks/", "olmo_data/hf_datasets/")),
                      (".whl/wandb-*.whl", ("wandb/bin/",))):
    path = glob.glob(pattern)[0]
    with zipfile.ZipFile(path) as src:
        items = [(i, src.read(i)) for i in src.infolist() if not i.filename.startswith(skip)]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info, data in items:
            if info.filename.endswith("RECORD"):
                data = b"".join(l for l in data.splitlines(True) if not l.startswith(tuple(s.encode() for s in skip)))
            dst.writestr(info, data)
PY
  du -sh .whl
  exit 0
fi

OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
# Each part has a time limit, so that one that hangs leaves the others their time (one run fits ~9 minutes).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/tests.log"
python3 -c 'import numpy, torch, transformers, olmo, olmo_repo; print("torch", torch.__version__, "cuda",
torch.version.cuda, "| numpy", numpy.__version__, "| transformers", transformers.__version__)' | tee -a "$OUT/tests.log"
python3 - <<'PY' 2>&1 | tee -a "$OUT/tests.log"
import importlib.util, torch, torch.distributed as dist
print("GPU-only remainder: nccl", dist.is_nccl_available(), "| bf16 autocast", torch.cuda.is_bf16_supported(),
      "| flash-attn", importlib.util.find_spec("flash_attn") is not None, "| torch.compile on CUDA: tested below")
PY
timeout 210 python3 -m pytest -q -rs -p no:cacheprovider --durations=10 tests/test_train_gpu.py 2>&1 | tee -a "$OUT/tests.log" || true
timeout 170 python3 bench/bench_repo.py --size gpu-1b,gpu-1b-gqa --profile --json "$OUT/bench-gpu.json" 2>&1 | tee "$OUT/bench.log" || true
# vLLM at the 1B shape, bf16, RePo vs RoPE (bench/bench_vllm.py): only where the image has vllm 0.32 (its wheel is
# far over what travels to the device) and this checkout is pip-installed there (the plugin's entry point).
if python3 -c 'import vllm' 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1 || true
  timeout 150 python3 bench/bench_vllm.py --size gpu-1b --json "$OUT/bench-vllm-gpu.json" 2>&1 | tee "$OUT/bench-vllm.log" || true
else
  echo "vLLM 1B case not run: this image has no vllm (install vllm==0.32.0 first)" | tee "$OUT/bench-vllm.log"
fi
# OLMo-core 3: its GPU test (tests/core/test_train_gpu.py: nccl, FSDP in bf16), then the 1B
# shape, RoPE vs RePo, MHA and GQA (bench/bench_core.py), from .whl/core/ in a folder of
# its own ahead of the one above on the path (ai2-olmo pins olmo-core 0.1.0; their shared dependencies come
# from /tmp/site); or from the Python that CORE_PYTHON names.
if [[ -d .whl/core ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-core .whl/core/*.whl
  CORE_PYTHON=python3 CORE_PATH="/tmp/site-core:/tmp/site:$PWD"
fi
if [[ -n "${CORE_PYTHON:-}" ]] && PYTHONPATH="${CORE_PATH:-$PWD}" "$CORE_PYTHON" -c 'import olmo_core.nn.attention'; then
  PYTHONPATH="${CORE_PATH:-$PWD}" timeout 100 "$CORE_PYTHON" -m pytest -q -rs -s -p no:cacheprovider --confcutdir tests/core \
    tests/core/test_train_gpu.py 2>&1 | tee "$OUT/tests-core.log" || true
  PYTHONPATH="${CORE_PATH:-$PWD}" timeout 90 "$CORE_PYTHON" bench/bench_core.py --size gpu-1b 2>&1 | tee "$OUT/bench-core.log" || true
else
  echo "OLMo-core 1B case not run: no .whl/core/ and no CORE_PYTHON with ai2-olmo-core==3.0.0" | tee "$OUT/bench-core.log"
fi
