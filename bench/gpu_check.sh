#!/usr/bin/env bash
# The GPU run of issues 49 and 59 in one go, what a session with a device runs first. Its parts run in order of value,
# each under a time limit and none past the run's deadline, and each writes its results as it finishes (a log, most a
# JSON, a line in parts.log), so that a run cut short keeps what it measured:
#
#   bash bench/gpu_check.sh wheels      # on a machine with PyPI: fetch the packages a bare GPU image lacks into .whl/
#   bash bench/gpu_check.sh             # on the GPU machine (python3 with CUDA torch): the parts below
#   python3 bench/gpu_summary.py gpu-out  # what ends the run; by hand after a run cut short (any machine)
#
# Copy the repository with .whl/ to the GPU machine in between if it has no PyPI. The deadline is DEADLINE seconds
# from the start (default 530: a 10-minute command less the installs). The parts, into $OUT (default ./gpu-out):
#   versions      GPU, driver, torch, CUDA, Triton (the image's own: the kernels use no API newer than 3.0),
#                 transformers, numpy, vLLM                                                   -> versions.log
#   kernels       tests/kernel_checks.py on the device: the kernels and RepoLayer against float64 and the torch
#                 code, forward and backward, at small and at the 1B's shapes (45 s)          -> kernels.log
#   check cost    bench/bench_check.py: the check before a kernel variant runs, per 1B specialisation
#                                                                                      -> check-cost.log/.json
#   saved bytes   bench/bench_saved.py: bytes per token a RePo layer keeps beyond RoPE's, bf16 -> saved.log/.json
#   ai2-olmo      bench_repo.py --size gpu-1b, then gpu-1b-gqa, each --profile (125 s each): the profile's
#                 RePo-only ops with their shares, timed rounds of RoPE, RePo and RePo without its kernels
#                 (step; decode per token with the KV cache), peak memory one model at a time, the pieces
#                 (f_phi and the rotation, with and without the kernels) and the accounted ratio
#                                                                       -> bench-1b.log/.json, bench-1b-gqa.log/.json
#   OLMo-core     bench_core.py --size gpu-1b --profile (115 s): the same through OLMo-core's model, MHA and GQA,
#                 decode per token through HF's static cache on the converted weights  -> bench-core.log/.json
#   training      the GPU training tests of both trainers (nccl, FSDP, bf16; ~5 minutes) -> tests.log, tests-core.log
#   vLLM          bench_vllm.py --size gpu-1b where the image has vllm 0.32 (what time is left) -> bench-vllm.log
# bench/gpu_summary.py ends the run: gpu-run-<date>.json and results-table.md (the table bench/RESULTS.md takes),
# and every target met, missed (with what holds it) or not measured.
# The image is assumed to hold torch (with its Triton), numpy, pandas, pyarrow, scikit-learn, torchmetrics and
# pytest already; transformers and everything else ai2-olmo imports at module level travel as wheels, pinned to the
# versions the CPU suite tests.
#
# SMOKE=1 PY=.venv/bin/python bash bench/gpu_check.sh   runs the machinery at CPU size (tests/test_bench.py): tiny
# models, the kernels under Triton's interpreter, one quick kernel test, no training tests, no OLMo-core unless
# CORE_PYTHON names its Python.
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

PY=${PY:-python3}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
: > "$OUT/parts.log"
if [[ -d .whl ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONUNBUFFERED=1
# OLMo-core 3 in a folder of its own ahead of the one above on the path (ai2-olmo pins olmo-core 0.1.0; their shared
# dependencies come from /tmp/site); or from the Python that CORE_PYTHON names.
if [[ -d .whl/core ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-core .whl/core/*.whl
  CORE_PYTHON=$PY CORE_PATH="/tmp/site-core:/tmp/site:$PWD"
fi

if [[ -n "${SMOKE:-}" ]]; then  # the machinery at CPU size
  export TRITON_INTERPRET=1
  sizes=(tiny) core_size=tiny kernel_tests=(-k olmo_repo_kernels)
  check_args=(--only decode --reps 1) saved_args=(--width tiny --tokens 16) bench_args=(--reps 2)
else
  sizes=(gpu-1b gpu-1b-gqa) core_size=gpu-1b kernel_tests=()
  check_args=() saved_args=() bench_args=(--profile)
fi

DEADLINE=${DEADLINE:-530}  # seconds from the start of the script: 9 minutes less what the installs above took
limit() {  # the smaller of $1 and the seconds left before the deadline (at least 1)
  local left=$((DEADLINE - SECONDS))
  echo $(( left < $1 ? (left > 1 ? left : 1) : $1 ))
}
part() {  # part NAME LIMIT COMMAND...: run it under its limit into $OUT/NAME.log; its end into parts.log
  local name=$1 seconds=$2 start=$SECONDS rc=0
  shift 2
  timeout "$(limit "$seconds")" "$@" > >(tee "$OUT/$name.log") 2>&1 || rc=$?
  echo "$name rc=$rc ${SECONDS}s (took $((SECONDS - start)) s)" >> "$OUT/parts.log"
}
{
  date -u +"%Y-%m-%d %H:%M UTC"; git rev-parse --short HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  $PY - <<'PY'
import importlib.util, numpy, torch, transformers, triton
vllm = importlib.util.find_spec("vllm") and __import__("vllm").__version__
print(f"torch {torch.__version__} cuda {torch.version.cuda} | triton {triton.__version__} | transformers "
      f"{transformers.__version__} | numpy {numpy.__version__} | vllm {vllm or 'absent'} | flash-attn "
      f"{importlib.util.find_spec('flash_attn') is not None}")
PY
} 2>&1 | tee "$OUT/versions.log" || true
part kernels 90 $PY -m pytest -q -rs -s -p no:cacheprovider --noconftest --durations=5 tests/kernel_checks.py "${kernel_tests[@]}"
part check-cost 60 $PY bench/bench_check.py --json "$OUT/check-cost.json" "${check_args[@]}"
part saved 60 $PY bench/bench_saved.py --json "$OUT/saved.json" "${saved_args[@]}"
# The 1B's models and a step's activations at 4 x 4096 outgrow an 80 GB H100 (2026-12-06): on a GPU of under
# 100 GB the benchmarks run 2 x 4096.
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1) || gib=""
batch=(); [[ -n "${gib:-}" && "${gib:-0}" -lt 100000 ]] && batch=(--batch 2)
for size in "${sizes[@]}"; do
  name=bench-${size#gpu-}
  part "$name" 125 $PY bench/bench_repo.py --size "$size" "${batch[@]}" "${bench_args[@]}" --json "$OUT/$name.json"
done
if [[ -n "${CORE_PYTHON:-}" ]] && PYTHONPATH="${CORE_PATH:-$PWD}" "$CORE_PYTHON" -c 'import olmo_core.nn.attention'; then
  part bench-core 115 env PYTHONPATH="${CORE_PATH:-$PWD}" "$CORE_PYTHON" bench/bench_core.py --size "$core_size" \
    "${batch[@]}" "${bench_args[@]}" --json "$OUT/bench-core.json"
else
  echo "OLMo-core 1B case not run: no .whl/core/ and no CORE_PYTHON with ai2-olmo-core==3.0.0" | tee "$OUT/bench-core.log"
fi
# The GPU training tests: ai2-olmo's (nccl with FSDP and CUDA autocast through scripts/train.py, flash-attn where the
# image has it, f_phi's bf16 GEMMs, torch.compile of the rotation) and OLMo-core's (nccl, FSDP in bf16).
if [[ -z "${SMOKE:-}" ]]; then
  part tests 210 $PY -m pytest -q -rs -p no:cacheprovider --durations=10 tests/test_train_gpu.py
fi
if [[ -n "${CORE_PYTHON:-}" && -z "${SMOKE:-}" ]]; then
  part tests-core 100 env PYTHONPATH="${CORE_PATH:-$PWD}" "$CORE_PYTHON" -m pytest -q -rs -s -p no:cacheprovider \
    --confcutdir tests/core tests/core/test_train_gpu.py
fi
# vLLM at the 1B shape, bf16, RePo vs RoPE (compiled: the torch code, which vLLM's inductor fuses; eager: RePo's
# kernels): only where the image has vllm 0.32 (its wheel is far over what travels to the device) and this checkout
# is pip-installed there (the plugin's entry point); it gets what time is left.
if [[ -z "${SMOKE:-}" ]] && $PY -c 'import vllm' 2>/dev/null; then
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1 || true
  part bench-vllm 150 $PY bench/bench_vllm.py --size gpu-1b --json "$OUT/bench-vllm-gpu.json"
else
  echo "vLLM 1B case not run: this image has no vllm (install vllm==0.32.0 first)" | tee "$OUT/bench-vllm.log"
fi
echo "== the run's record ($SECONDS s in all)"
$PY bench/gpu_summary.py "$OUT"
