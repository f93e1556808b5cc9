# Sourced by the README's commands: creates .venv and installs the package
# (with the test and hf extras) when setup.py changed since the last install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
stamp=.venv/.cascade_jax_installed
want=$(sha256sum setup.py | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "[setup] installing cascade_jax and its dependencies into .venv ..."
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,hf]'
  echo "$want" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
# glibc's malloc backs its large blocks with transparent huge pages where the
# kernel allows them ("madvise" mode): XLA's CPU runtime allocates each
# program's temporaries anew at every call (about 455 MB a step of the main
# job's SFT), and with 4 kB pages every call faulted them in again. On a
# 2-core EPYC, 100 SFT steps and their evaluation: 14.3 M page faults -> 1.5 M,
# system time 39.8 s -> 29.3 s, wall 118 s -> 112 s
# (docs/results/main_job_eval_worker_2026-12-05). A value you set is kept.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}"

