#!/bin/bash
# Rules 18 and 19 (docs/claims/18_math_hybrid.json,
# docs/claims/19_if_rl_reward_hybrid.json): GRPO on math and IF-RL with the
# paper's reward, each rerun from the SFT of one hybrid base run, 3 stage
# seeds. From the repository root of a clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_sft_reruns.sh RUNS
#
# Then RUNS/base/report/report.json to .../hybrid_math/base/, each
# RUNS/math_rl/seedS/rerun.json to .../hybrid_math/math_rl/seedS/ and each
# RUNS/if_rl_passed/seedS/rerun.json to .../hybrid_if_rl/if_rl_passed/seedS/.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid --config.seed=0"
mkdir -p "$RUNS"
if [[ ! -f "$RUNS/base/rm/stage.json" ]]; then
  echo "start base $(date -u +%FT%TZ)"
  $PY -m experiments.cascade $HYB --config.order=sft,rm \
    --workdir="$RUNS/base" > "$RUNS/base.log" 2>&1
  echo "done base $(date -u +%FT%TZ)"
fi
for S in 0 1 2; do
  if [[ ! -f "$RUNS/if_rl_passed/seed$S/rerun.json" ]]; then
    echo "start if_rl_passed seed $S $(date -u +%FT%TZ)"
    $PY -m experiments.rerun_stage $HYB --run="$RUNS/base" --stage=if_rl \
      --config.stages.if_rl.steps=90 \
      --config.stages.if_rl.rl.verifier_reward=passed --stage_seed=$S \
      --workdir="$RUNS/if_rl_passed/seed$S" > "$RUNS/if_rl_passed.seed$S.log" 2>&1
    echo "done if_rl_passed seed $S $(date -u +%FT%TZ)"
  fi
  if [[ ! -f "$RUNS/math_rl/seed$S/rerun.json" ]]; then
    echo "start math_rl seed $S $(date -u +%FT%TZ)"
    $PY -m experiments.rerun_stage $HYB --config.order=sft,math_rl \
      --run="$RUNS/base" --stage=math_rl --stage_seed=$S \
      --workdir="$RUNS/math_rl/seed$S" > "$RUNS/math_rl.seed$S.log" 2>&1
    echo "done math_rl seed $S $(date -u +%FT%TZ)"
  fi
done
echo "all done $(date -u +%FT%TZ)"
