#!/bin/bash
# Rule 24 (docs/claims/24_lc_lr_hybrid.json): long-context RL at half its
# learning rate against the default, 3 stage seeds each, from rule 20's
# hybrid cascade (seed 0) through rlhf. From the repository root of a
# clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_lc_lr.sh RUNS
#
# RUNS/base: that cascade (run through rlhf first if absent). Then each
# RUNS/lc_lr/ARM/seedS/rerun.json to
# docs/results/claims/<date>/hybrid_lc_lr/ARM/seedS/.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid --config.seed=0"
if [[ ! -f "$RUNS/base/rlhf/stage.json" ]]; then
  echo "start base $(date -u +%FT%TZ)"
  $PY -m experiments.cascade $HYB \
    --config.order=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf \
    --workdir="$RUNS/base" > "$RUNS/base_to_rlhf.log" 2>&1
fi
for S in 0 1 2; do
  for ARM in default lr1e-4; do
    OUT="$RUNS/lc_lr/$ARM/seed$S"
    [[ -f "$OUT/rerun.json" ]] && continue
    LR=()
    [[ $ARM == lr1e-4 ]] && LR=(--config.stages.long_context_rl.optim.lr=1e-4)
    echo "start $ARM seed $S $(date -u +%FT%TZ)"
    $PY -m experiments.rerun_stage $HYB --run="$RUNS/base" \
      --stage=long_context_rl --stage_seed=$S "${LR[@]}" --workdir="$OUT" \
      > "$RUNS/lc_lr.$ARM.seed$S.log" 2>&1
  done
done
echo "all done $(date -u +%FT%TZ)"
