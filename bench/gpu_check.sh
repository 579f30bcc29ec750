#!/usr/bin/env bash
# The GPU checks of the project in one run: the GPU tests, then the benchmark at the full 1B shape.
#
#   bash bench/gpu_check.sh wheels      # on a machine with PyPI: fetch the packages a bare GPU image lacks into .whl/
#   bash bench/gpu_check.sh             # on the GPU machine (python3 with CUDA torch): install .whl/, run
#
# Copy the repository with .whl/ to the GPU machine in between if it has no PyPI. About 8 minutes on one H200. FSDP itself runs in the CPU suite (gloo); this run covers what only a GPU has,
# tests/test_train_gpu.py: nccl with FSDP and CUDA autocast (amp_bf16) through scripts/train.py, flash-attn
# (when the image has it: it is built against the image's torch, so no wheel travels), the bf16 GEMMs of
# f_phi, torch.compile of the rotation on CUDA; then `bench_repo.py --size gpu-1b,gpu-1b-gqa --profile`.
#
# Results go to $OUT (default ./gpu-out): tests.log, bench.log, bench-gpu.json. The image is assumed to hold
# torch, numpy, transformers, pandas, pyarrow, scikit-learn, torchmetrics and pytest already; everything else
# ai2-olmo imports at module level travels as wheels, pinned to the versions the CPU suite tests.
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
  opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
)

if [[ "${1:-}" == "wheels" ]]; then
  mkdir -p .whl
  platforms=()
  for n in 28 27 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
  python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # published as a source archive only
  # ai2-olmo's wheel is 145 MB, mostly evaluation data the checks do not read: drop it to fit the 64 MiB
  # that travels to the device.
  python3 - <<'PY'
import glob, zipfile
path = glob.glob(".whl/ai2_olmo-*.whl")[0]
skip = ("olmo_data/oe_eval_tasks/", "olmo_data/hf_datasets/")
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
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/tests.log"
python3 -c 'import torch, olmo, olmo_repo; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/tests.log"
python3 - <<'PY' 2>&1 | tee -a "$OUT/tests.log"
import importlib.util, torch, torch.distributed as dist
print("GPU-only remainder: nccl", dist.is_nccl_available(), "| bf16 autocast", torch.cuda.is_bf16_supported(),
      "| flash-attn", importlib.util.find_spec("flash_attn") is not None, "| torch.compile on CUDA: tested below")
PY
python3 -m pytest -q -rs -p no:cacheprovider tests/test_train_gpu.py 2>&1 | tee -a "$OUT/tests.log" || true
python3 bench/bench_repo.py --size gpu-1b,gpu-1b-gqa --profile --json "$OUT/bench-gpu.json" 2>&1 | tee "$OUT/bench.log"
# vLLM at the 1B shape, bf16, RePo vs RoPE (bench/bench_vllm.py): only where the image has vllm 0.32 (its wheel is
# far over what travels to the device) and this checkout is pip-installed there (the plugin's entry point).
if python3 -c 'import vllm' 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1 || true
  python3 bench/bench_vllm.py --size gpu-1b --json "$OUT/bench-vllm-gpu.json" 2>&1 | tee "$OUT/bench-vllm.log"
else
  echo "vLLM 1B case not run: this image has no vllm (install vllm==0.32.0 first)" | tee "$OUT/bench-vllm.log"
fi
# OLMo-core at the 1B shape, RoPE vs RePo, MHA and GQA (bench/bench_core.py): only where the image has
# ai2-olmo-core 3 in a Python of its own (ai2-olmo above pins olmo-core 0.1.0), named by CORE_PYTHON.
if [[ -n "${CORE_PYTHON:-}" ]] && "$CORE_PYTHON" -c 'import olmo_core.nn.attention' 2>/dev/null; then
  PYTHONPATH="$PWD" "$CORE_PYTHON" bench/bench_core.py --size gpu-1b 2>&1 | tee "$OUT/bench-core.log"
else
  echo "OLMo-core 1B case not run: set CORE_PYTHON to a python with ai2-olmo-core==3.0.0" | tee "$OUT/bench-core.log"
fi
