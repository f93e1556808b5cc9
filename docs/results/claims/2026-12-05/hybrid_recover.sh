#!/bin/bash
# Rule 20 (docs/claims/20_recover_hybrid.json): MOPD recovering the math
# the hybrid's RLHF forgot, against GRPO on math, 3 stage seeds from one
# hybrid cascade (seed 0) run through rlhf. From the repository root of a
# clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_recover.sh RUNS
#
# RUNS/base may hold the finished stages of rules 18-19's base (sft, rm of
# the same config and seed): the cascade resumes after them. Then each
# RUNS/recover/seedS/{mopd,grpo}/rerun.json to
# docs/results/claims/<date>/hybrid_recover/seedS/{mopd,grpo}/.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid --config.seed=0"
mkdir -p "$RUNS"
if [[ ! -f "$RUNS/base/rlhf/stage.json" ]]; then
  echo "start base $(date -u +%FT%TZ)"
  $PY -m experiments.cascade $HYB \
    --config.order=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf \
    --workdir="$RUNS/base" > "$RUNS/base_to_rlhf.log" 2>&1
  echo "done base $(date -u +%FT%TZ)"
fi
for S in 0 1 2; do
  [[ -f "$RUNS/recover/seed$S/grpo/rerun.json" ]] && continue
  echo "start recover seed $S $(date -u +%FT%TZ)"
  $PY -m experiments.recover $HYB --run="$RUNS/base" --after=rlhf \
    --domains=math --stage_seed=$S --workdir="$RUNS/recover/seed$S" \
    > "$RUNS/recover.seed$S.log" 2>&1
  echo "done recover seed $S $(date -u +%FT%TZ)"
done
echo "all done $(date -u +%FT%TZ)"
