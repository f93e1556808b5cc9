#!/bin/bash
# Rule 26 (docs/claims/26_rlhf_reward_hybrid.json): RLHF from MOPD with the
# generative judge (the paper's reward) against the Bradley-Terry reward
# model, 3 stage seeds each, from one hybrid judge cascade (seed 0) through
# mopd. From the repository root of a clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_rlhf_reward.sh RUNS
#
# RUNS/base: that cascade (run through mopd first if absent). The six
# reruns go two at a time (2 cores). Then each RUNS/R_kl0.1_seedS/rerun.json
# to docs/results/claims/<date>/hybrid_rlhf_reward/R_kl0.1_seedS/.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py:judge --config.model=hybrid --config.seed=0"
mkdir -p "$RUNS"
if [[ ! -f "$RUNS/base/mopd/stage.json" ]]; then
  echo "start base $(date -u +%FT%TZ)"
  $PY -m experiments.cascade $HYB \
    --config.order=sft,rm,judge,rlhf_branch,if_rl,multi_domain_rl,mopd \
    --workdir="$RUNS/base" > "$RUNS/base_to_mopd.log" 2>&1
fi
for S in 0 1 2; do
  for R in judge bt; do echo "$R $S"; done
done | xargs -P 2 -L 1 bash -c '
  R=$0; S=$1
  declare -A NAME=([judge]=generative_judge [bt]=bradley_terry)
  OUT='"$RUNS"'/${R}_kl0.1_seed$S
  [[ -f "$OUT/rerun.json" ]] && exit 0
  echo "start $R seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.rerun_stage '"$HYB"' --run='"$RUNS"'/base \
    --stage=rlhf --config.stages.rlhf.reward=${NAME[$R]} --stage_seed=$S \
    --workdir=$OUT > '"$RUNS"'/rlhf.$R.seed$S.log 2>&1
  echo "done $R seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
