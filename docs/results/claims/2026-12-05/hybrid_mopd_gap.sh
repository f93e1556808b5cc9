#!/bin/bash
# Rule 23 (docs/claims/23_mopd_gap_hybrid.json): rule 14 (MOPD against GRPO
# at a real gap) on the hybrid. From the repository root of a clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_mopd_gap.sh RUNS
#
# RUNS/base may hold rule 20's hybrid cascade through rlhf (the same config
# and seed): the cascade resumes after it and runs long_context_rl, the
# student. The teacher next (math_rl, 90 steps from the cascade's SFT), then
# the 5 seeds as two launchers side by side (seeds 0, 2, 4 and 1, 3). Then
# RUNS/seedsK/results.json to docs/results/claims/<date>/hybrid_mopd_gap/seedsK/.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid --config.seed=0"
mkdir -p "$RUNS"
if [[ ! -f "$RUNS/base/long_context_rl/stage.json" ]]; then
  echo "start base $(date -u +%FT%TZ)"
  $PY -m experiments.cascade $HYB \
    --config.order=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf,long_context_rl \
    --workdir="$RUNS/base" > "$RUNS/base_to_lc.log" 2>&1
  echo "done base $(date -u +%FT%TZ)"
fi
if [[ ! -f "$RUNS/teacher/rerun.json" ]]; then
  echo "start teacher $(date -u +%FT%TZ)"
  $PY -m experiments.rerun_stage $HYB --run="$RUNS/base" --stage=math_rl \
    --config.order=sft,math_rl --config.stages.math_rl.steps=90 \
    --stage_seed=0 --workdir="$RUNS/teacher" > "$RUNS/teacher.log" 2>&1
  echo "done teacher $(date -u +%FT%TZ)"
fi
for K in 024 13; do
  SEEDS="($(echo $K | sed 's/./&,/g'))"
  $PY -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py:gap \
    --config.init_from="$RUNS/base/long_context_rl" --config.teacher="$RUNS/teacher" \
    --config.seeds="$SEEDS" --workdir="$RUNS/seeds$K" > "$RUNS/seeds$K.log" 2>&1 &
done
wait
echo "all done $(date -u +%FT%TZ)"
