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
