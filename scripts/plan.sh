#!/usr/bin/env bash
# The AOT plan compiled for TPU topologies on this host (experiments.plan):
# makes .venv-tpu once (jax[tpu] at the project venv's jax version: its
# libtpu, ~700 MB, plus cascade_jax), then runs the plan with its arguments.
#   bash scripts/plan.sh --config=configs/plan.py:qwen3_30b_a3b --workdir=/tmp/plan
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup.sh
if [[ ! -x .venv-tpu/bin/python ]]; then
  v=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
  python3 -m venv .venv-tpu
  .venv-tpu/bin/pip install -q "jax[tpu]==$v" -e .
fi
exec .venv-tpu/bin/python -m experiments.plan "$@"
