#!/bin/bash
# Rule 17 (docs/claims/17_hybrid_rlhf.json): the hybrid's RLHF stage
# (after MOPD) under four settings, 3 stage seeds each, from one hybrid
# cascade run through MOPD. From the repository root of a clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_rlhf/run.sh RUNS
#
# Then each RUNS/ARM/seedS/rerun.json to
# docs/results/claims/<date>/hybrid_rlhf/ARM/seedS/rerun.json.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid --config.seed=0"
mkdir -p "$RUNS"
if [[ ! -f "$RUNS/base/mopd/stage.json" ]]; then
  echo "start base $(date -u +%FT%TZ)"
  $PY -m experiments.cascade $HYB \
    --config.order=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd \
    --workdir="$RUNS/base" > "$RUNS/base.log" 2>&1
  echo "done base $(date -u +%FT%TZ)"
fi
for S in 0 1 2; do
  for A in default lr5e-4 kl0.03 steps30; do
    case $A in
      default) X=() ;;
      lr5e-4) X=(--config.stages.rlhf.optim.lr=5e-4) ;;
      kl0.03) X=(--config.stages.rlhf.rl.kl_coef=0.03) ;;
      steps30) X=(--config.stages.rlhf.steps=30) ;;
    esac
    [[ -f "$RUNS/$A/seed$S/rerun.json" ]] && continue
    echo "start $A seed $S $(date -u +%FT%TZ)"
    $PY -m experiments.rerun_stage $HYB --run="$RUNS/base" --stage=rlhf \
      --stage_seed=$S "${X[@]}" --workdir="$RUNS/$A/seed$S" \
      > "$RUNS/$A.seed$S.log" 2>&1
    echo "done $A seed $S $(date -u +%FT%TZ)"
  done
done
echo "all done $(date -u +%FT%TZ)"
