#!/usr/bin/env bash
# Run here (with the package index): downloads into .gpu_wheels/ the wheels
# that scripts/gpu_bench.sh installs on a GPU machine whose image has JAX,
# flax, optax, orbax and sentencepiece but no network: tokamax and what
# cascade_jax imports beyond that image, built for that machine's Python
# (GPU_PYTHON_VERSION, default 3.12: the device image's, per its notes).
# tokamax pinned to the version that ran on the H200 (2026-12-04).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu_wheels
python3 -m pip download -q --no-deps -d .gpu_wheels --only-binary=:all: \
  --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any \
  tokamax==0.0.17 qwix einshape immutabledict typeguard==2.13.3 \
  ml-collections grain array-record portpicker math-verify \
  latex2sympy2-extended antlr4-python3-runtime==4.13.2 tensorboardX
# pydantic (tokamax's) with its matching compiled core.
python3 -m pip download -q -d .gpu_wheels --only-binary=:all: \
  --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any pydantic
ls .gpu_wheels
