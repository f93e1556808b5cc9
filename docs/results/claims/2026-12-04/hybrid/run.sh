#!/bin/bash
# Rules 15 and 16 (docs/claims/15_own_domain_hybrid.json,
# 16_forgetting_hybrid.json): the hybrid main job, 3 seeds, one after
# another, from the repository root of a clean worktree.
#
#   bash docs/results/claims/2026-12-04/hybrid/run.sh RUNS
#
# Then each RUNS/seed=S/report/report.json to
# docs/results/claims/<date>/hybrid/seedS/report.json.
set -eu
RUNS=$1
PY=${PY:-python}
mkdir -p "$RUNS"
for S in 0 1 2; do
  echo "start seed $S $(date -u +%FT%TZ)"
  $PY -m experiments.cascade --config=configs/cascade.py --config.model=hybrid \
    --config.seed=$S --workdir="$RUNS/seed=$S" > "$RUNS/seed$S.log" 2>&1
  echo "done seed $S rc=$? $(date -u +%FT%TZ)"
done
echo "all done $(date -u +%FT%TZ)"
