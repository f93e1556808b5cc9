#!/usr/bin/env bash
# The accelerator checks of issue 16, on a GPU machine whose image has its own
# JAX: first `bash scripts/gpu_wheels.sh` here, then (device tool, carry
# .gpu_wheels) `bash scripts/gpu_bench.sh`. Under 8 minutes on an H200:
#   1. the `gpu` tests: each op's fused kernels equal the reference, bf16 + fp32
#   2. experiments.bench_accel at full size: MoE layer vs ideal, train-step
#      MFU, decode tokens/s and HBM fraction, as one table
# Results: $OUT (the device tool's folder) or runs/gpu_bench. A dry run on CPU:
#   SKIP_WHEELS=1 JAX_PLATFORMS=cpu BENCH_CONFIG=configs/bench_accel.py:quick \
#     PYTHON=.venv/bin/python bash scripts/gpu_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${OUT:-runs/gpu_bench}
mkdir -p "$out"
if [[ -z ${SKIP_WHEELS:-} ]] && compgen -G '.gpu_wheels/*.whl' > /dev/null; then
  $PY -m pip install -q --no-index --no-deps .gpu_wheels/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
$PY -c 'import jax, tokamax; print(jax.__version__, jax.devices())' 2>&1 | tee -a "$out/gpu.txt"
timeout 200 $PY -m pytest -q -m gpu tests/test_ops.py -p no:cacheprovider \
  2>&1 | tee "$out/gpu_tests.log"
timeout 330 $PY -m experiments.bench_accel --config="${BENCH_CONFIG:-configs/bench_accel.py}" \
  --workdir="$out" 2>&1 | tee "$out/bench.log"
