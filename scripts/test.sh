#!/usr/bin/env bash
# The test suite. Default: everything but `slow` and `gpu` tests. In CI
# (CI=true) the slow tests run too, and then the sampler's tests once with the
# CPU kernels forced off (XLA's ops, the path accelerator users run) and once
# forced on, whatever the calibration picks on this machine (the episode
# slots on `small` among them). Extra arguments
# go to pytest.
source "$(dirname "$0")/_setup.sh"
markers='not slow and not gpu'
if [[ "${CI:-}" == "true" ]]; then markers='not gpu'; fi
ruff check --quiet .
# pytest exits 5 when no test ran: that is a failure here too.
python -m pytest -n 2 --dist loadgroup -m "$markers" "$@" || exit $?
if [[ "${CI:-}" == "true" ]]; then
  for k in 0 1; do
    echo "[test] sampler and rollout tests with CASCADE_JAX_CPU_KERNELS=$k"
    CASCADE_JAX_CPU_KERNELS=$k python -m pytest -n 2 -q -m "$markers" \
      tests/test_rollout.py tests/test_kernels.py \
      tests/test_continuous.py::test_continuous_batching_on_the_main_job_model \
      "tests/test_episodes.py::test_continuous_episodes_equal_the_fixed_batch_with_the_same_keys[small]" \
      || exit $?
  done
fi
