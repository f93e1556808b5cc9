#!/bin/bash
# Rule 28 (docs/claims/28_if_hurts_hybrid.json): IF-RL from the SFT of rule
# 26's hybrid cascade, 3 stage seeds. From the repository root of a clean
# worktree, once RUNS/base has its sft stage (rule 26's script makes it):
#
#   bash docs/results/claims/2026-12-05/hybrid_if_hurts.sh RUNS
#
# Then each RUNS/if_rl/seedS/rerun.json to
# docs/results/claims/<date>/hybrid_if_hurts/if_rl/seedS/ and, once the
# cascade is done, RUNS/base/report/report.json to .../hybrid_if_hurts/base/.
set -eu
RUNS=$1
PY=${PY:-python}
for S in 0 1 2; do
  OUT="$RUNS/if_rl/seed$S"
  [[ -f "$OUT/rerun.json" ]] && continue
  echo "start if_rl seed $S $(date -u +%FT%TZ)"
  $PY -m experiments.rerun_stage --config=configs/cascade.py \
    --config.model=hybrid --config.seed=0 --run="$RUNS/base" --stage=if_rl \
    --stage_seed=$S --workdir="$OUT" > "$RUNS/if_rl.seed$S.log" 2>&1
done
echo "all done $(date -u +%FT%TZ)"
