#!/bin/bash
# Rule 14 (docs/claims/14_mopd_gap.json): MOPD against GRPO at a real gap.
#
#   bash docs/results/claims/2026-12-04/mopd_gap/run.sh RUN WORK
#
# RUN: a finished seed-0 main job (its sft and long_context_rl stages);
# WORK: where the teacher and the arms write. From the repository root of a
# clean worktree. The teacher first (math_rl, 90 steps from RUN's SFT), then
# the 5 seeds as two launchers side by side (seeds 0, 2, 4 and 1, 3). Then
# WORK/seedsK/results.json to docs/results/claims/<date>/mopd_gap/seedsK/.
set -eu
RUN=$1; WORK=$2
PY=${PY:-python}
mkdir -p "$WORK"
if [ ! -f "$WORK/teacher/rerun.json" ]; then
  $PY -m experiments.rerun_stage --run="$RUN" --stage=math_rl \
    --config.order=sft,math_rl --config.stages.math_rl.steps=90 \
    --stage_seed=0 --workdir="$WORK/teacher" > "$WORK/teacher.log" 2>&1
fi
echo "teacher done $(date -u +%FT%TZ)"
while [ ! -f "$RUN/long_context_rl/stage.json" ]; do sleep 20; done
for K in 024 13; do
  SEEDS="($(echo $K | sed 's/./&,/g'))"
  $PY -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py:gap \
    --config.init_from="$RUN/long_context_rl" --config.teacher="$WORK/teacher" \
    --config.seeds="$SEEDS" --workdir="$WORK/seeds$K" > "$WORK/seeds$K.log" 2>&1 &
done
wait
echo "all done $(date -u +%FT%TZ)"
