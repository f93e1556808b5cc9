#!/usr/bin/env bash
# The test suite. Default: everything but `slow` and `gpu` tests. In CI
# (CI=true) the slow tests run too, and then the sampler's tests with the CPU
# kernels forced off (XLA's ops, the path accelerator users run) and forced
# on (the episode slots on `small` among them): each setting the run above
# did not already take, by what the calibration picked on this machine (all
# kernels: only off; none: only on; some: both). Extra arguments go to
# pytest.
source "$(dirname "$0")/_setup.sh"
# One XLA compilation cache for every pytest run below, fresh each time (a
# laptop and CI start equally cold): CI's kernel loops load what the main
# run compiled. tests/conftest.py makes one when none is given.
if [[ -z "${CASCADE_JAX_XLA_CACHE:-}" ]]; then
  export CASCADE_JAX_XLA_CACHE="$(mktemp -d -t cascade_jax_test_xla_XXXXXX)"
  trap 'rm -rf "$CASCADE_JAX_XLA_CACHE"' EXIT
fi
markers='not slow and not gpu'
if [[ "${CI:-}" == "true" ]]; then markers='not gpu'; fi
ruff check --quiet .
# pytest exits 5 when no test ran: that is a failure here too.
python -m pytest -n 2 --dist loadgroup -m "$markers" "$@" || exit $?
if [[ "${CI:-}" == "true" ]]; then
  # What the run above used: every kernel (1), none (0) or some (01).
  # (rollout registers the sampler's step that the calibration times.)
  ran=$(python -c 'from cascade_jax import ops, rollout
use = [ops.cpu_kernel_enabled(op) is True for op in ops.CPU_KERNEL_OPS]
print(1 if all(use) else 0 if not any(use) else "01")' | tail -1)
  for k in 0 1; do
    if [[ "$ran" == "$k" ]]; then
      echo "[test] CASCADE_JAX_CPU_KERNELS=$k: the run above ran so"
      continue
    fi
    echo "[test] sampler and rollout tests with CASCADE_JAX_CPU_KERNELS=$k"
    CASCADE_JAX_CPU_KERNELS=$k python -m pytest -n 2 -q -m "$markers" \
      tests/test_rollout.py tests/test_kernels.py \
      tests/test_continuous.py::test_continuous_batching_on_the_main_job_model \
      "tests/test_episodes.py::test_continuous_episodes_equal_the_fixed_batch_with_the_same_keys[small]" \
      || exit $?
  done
fi
