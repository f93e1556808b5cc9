#!/usr/bin/env bash
# The test suite. Default: everything but `slow` and `gpu` tests. In CI
# (CI=true) the slow tests run too. Extra arguments go to pytest.
source "$(dirname "$0")/_setup.sh"
markers='not slow and not gpu'
if [[ "${CI:-}" == "true" ]]; then markers='not gpu'; fi
ruff check --quiet .
# pytest exits 5 when no test ran: that is a failure here too.
exec python -m pytest -n 2 -m "$markers" "$@"
