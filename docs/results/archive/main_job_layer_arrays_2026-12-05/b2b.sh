#!/bin/bash
# usage: b2b3.sh name:commit:TUNABLES ...   (TUNABLES '-' for none)
cd /work/main
for spec in "$@"; do
  IFS=: read -r n c t <<< "$spec"
  rm -rf /tmp/wt_$n /tmp/xla_$n /tmp/mj_$n; git worktree prune
  git worktree add -q /tmp/wt_$n $c
  ln -s /work/main/.venv /tmp/wt_$n/.venv
  cd /tmp/wt_$n
  if [[ "$t" != "-" ]]; then export GLIBC_TUNABLES="$t"; else unset GLIBC_TUNABLES; fi
  CASCADE_JAX_XLA_CACHE=/tmp/xla_$n PYTHONPATH=/tmp/wt_$n /usr/bin/time -v bash scripts/main.sh --workdir=/tmp/mj_$n $EXTRA > /tmp/mj_$n.log 2>&1
  unset GLIBC_TUNABLES
  cd /work/main
done
echo done > /tmp/b2b3.done
