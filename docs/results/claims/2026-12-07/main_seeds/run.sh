#!/bin/bash
# Rules 34, 35 and 36 (docs/claims/34_own_domain_seeds.json,
# 35_if_hurts_seeds.json, 36_forgetting_seeds.json): the main job at
# cascade seeds 3, 4 and 5, one after another, from the repository root of
# a clean worktree of the rules' commit.
#
#   bash docs/results/claims/2026-12-07/main_seeds/run.sh RUNS
#
# Then each RUNS/seed=S/report/report.json (and report.md) to
# docs/results/claims/<date>/main_seeds/seedS/.
set -eu
RUNS=$1
PY=${PY:-python}
mkdir -p "$RUNS"
for S in 3 4 5; do
  echo "start seed $S $(date -u +%FT%TZ)"
  rc=0
  /usr/bin/time -v $PY -m experiments.cascade --config=configs/cascade.py \
    --config.seed=$S --workdir="$RUNS/seed=$S" > "$RUNS/seed$S.log" 2>&1 \
    || rc=$?
  echo "done seed $S rc=$rc $(date -u +%FT%TZ)"
done
echo "all done $(date -u +%FT%TZ)"
