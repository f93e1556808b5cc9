#!/usr/bin/env bash
# The accelerator checks, on a GPU machine whose image has its own
# JAX: first `bash scripts/gpu_wheels.sh` here, then (device tool, carry
# .gpu_wheels) `bash scripts/gpu_bench.sh`. On an H200 (2026-12-04): tests 70 s, bench about 400 s (MoE 42,
# train 137, decode 121, mismatch 103 s), so one 15-minute lease holds it:
#   1. the `gpu` tests: each op's fused kernels equal the reference, bf16 + fp32
#   2. benchmarks.accel at full size: MoE layer vs ideal, train-step
#      MFU, decode tokens/s and HBM fraction, as one table
# BENCH_PARTS=mismatch (say) runs only those parts of the benchmark.
# Results: $OUT (the device tool's folder) or runs/gpu_bench. A dry run on CPU:
#   SKIP_WHEELS=1 JAX_PLATFORMS=cpu BENCH_CONFIG=benchmarks/configs/accel.py:quick \
#     PYTHON=.venv/bin/python bash scripts/gpu_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${OUT:-runs/gpu_bench}
mkdir -p "$out"
if [[ -z ${SKIP_WHEELS:-} ]] && compgen -G '.gpu_wheels/*.whl' > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_site \
    .gpu_wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH=/tmp/gpu_site:${PYTHONPATH:-}
fi
# tokamax >= 0.0.17 imports xprof's kernel-stats tool at import, for its own
# benchmarking (which cascade_jax never calls); xprof (77 MB, with a web
# server's dependencies) is not on GPU images: a stub of that one name.
if ! $PY -c 'import xprof' 2> /dev/null; then
  mkdir -p /tmp/gpu_stub/xprof/cli
  touch /tmp/gpu_stub/xprof/__init__.py /tmp/gpu_stub/xprof/cli/__init__.py
  echo 'get_kernel_stats_tool = None  # stub: see scripts/gpu_bench.sh' \
    > /tmp/gpu_stub/xprof/cli/tools.py
  export PYTHONPATH=${PYTHONPATH:-}:/tmp/gpu_stub
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version \
  --format=csv 2>&1 | tee "$out/gpu.txt"
$PY -c '
import importlib.metadata as md, jax
print("jax", jax.__version__, jax.devices())
for p in ("jaxlib", "flax", "optax", "orbax-checkpoint", "tokamax", "grain"):
  try: print(p, md.version(p))
  except Exception as e: print(p, "missing", e)
import tokamax; print("tokamax imports")' 2>&1 | tee -a "$out/gpu.txt"
SECONDS=0
timeout ${TEST_TIMEOUT:-180} $PY -m pytest -q -m gpu tests/test_ops.py \
  -p no:cacheprovider -o addopts= -ra 2>&1 | tee "$out/gpu_tests.log"
echo "[gpu_bench] tests: ${SECONDS}s" | tee -a "$out/gpu.txt"
SECONDS=0
timeout ${BENCH_TIMEOUT:-450} $PY -m benchmarks.accel \
  --config="${BENCH_CONFIG:-benchmarks/configs/accel.py}" --workdir="$out" \
  ${BENCH_PARTS:+--config.parts=$BENCH_PARTS} 2>&1 \
  | tee "$out/bench.log"
echo "[gpu_bench] bench: ${SECONDS}s" | tee -a "$out/gpu.txt"
