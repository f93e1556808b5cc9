#!/usr/bin/env bash
# AOT-compiles the ops' TPU kernels on this CPU host (scripts/tpu_aot_ops.py).
# Makes .venv-tpu once: jax[tpu] at the project venv's jax version, tokamax.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv-tpu/bin/python ]]; then
  python3 -m venv .venv-tpu
  v=$(.venv/bin/python -c 'import jax; print(jax.__version__)' 2>/dev/null || echo 0.10.2)
  .venv-tpu/bin/pip install -q "jax[tpu]==$v" tokamax absl-py
fi
export TPU_SKIP_MDS_QUERY=1 TPU_WORKER_HOSTNAMES=localhost PYTHONPATH=$PWD
exec .venv-tpu/bin/python scripts/tpu_aot_ops.py "$@"
