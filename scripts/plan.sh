#!/usr/bin/env bash
# The AOT plan compiled for TPU topologies on this host (experiments.plan):
# makes .venv-tpu (jax[tpu] at the project venv's jax version: its libtpu,
# ~700 MB, plus cascade_jax; again when setup.py changes), then runs the
# plan with its arguments.
#   bash scripts/plan.sh --config=configs/plan.py:qwen3_30b_a3b --workdir=/tmp/plan
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup.sh
stamp=.venv-tpu/.cascade_jax_installed
want=$(sha256sum setup.py | cut -d' ' -f1)
if [[ ! -x .venv-tpu/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  # (Re)installed when setup.py changed, as .venv is (scripts/_setup.sh).
  v=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
  [[ -x .venv-tpu/bin/python ]] || python3 -m venv .venv-tpu
  .venv-tpu/bin/pip install -q "jax[tpu]==$v" -e .
  echo "$want" > "$stamp"
fi
exec .venv-tpu/bin/python -m experiments.plan "$@"
