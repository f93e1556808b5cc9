#!/bin/bash
# Rule 22 (docs/claims/22_lc_mix_hybrid.json): long-context RL alone
# against mixed with math and code, on the hybrid, 3 stage seeds from rule
# 20's hybrid cascade (seed 0, run through rlhf). From the repository root
# of a clean worktree, with RUNS/base holding that cascade:
#
#   bash docs/results/claims/2026-12-05/hybrid_lc_mix.sh RUNS
#
# Then each RUNS/lc_mix/ARM/seedS/rerun.json to
# docs/results/claims/<date>/hybrid_lc_mix/ARM/seedS/rerun.json.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid --config.seed=0"
MIXED="--config.order=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf,long_context_mixed"
[[ -f "$RUNS/base/rlhf/stage.json" ]] || { echo "no $RUNS/base/rlhf"; exit 1; }
for S in 0 1 2; do
  for A in alone mixed; do
    [[ -f "$RUNS/lc_mix/$A/seed$S/rerun.json" ]] && continue
    echo "start $A seed $S $(date -u +%FT%TZ)"
    if [[ $A == alone ]]; then
      X=(--stage=long_context_rl)
    else
      X=($MIXED --stage=long_context_mixed)
    fi
    $PY -m experiments.rerun_stage $HYB "${X[@]}" --run="$RUNS/base" \
      --stage_seed=$S --workdir="$RUNS/lc_mix/$A/seed$S" \
      > "$RUNS/lc_mix.$A.seed$S.log" 2>&1
    echo "done $A seed $S $(date -u +%FT%TZ)"
  done
done
echo "all done $(date -u +%FT%TZ)"
