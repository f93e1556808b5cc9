#!/bin/bash
# Rule 29 (docs/claims/29_stage_order_hybrid.json): rule 12's three stage
# orders on the hybrid, per seed from one SFT and reward model. From the
# repository root of a clean worktree:
#
#   bash docs/results/claims_2026-12-05/hybrid_stage_order.sh RUNS
#
# Three hybrid SFTs, then nine hybrid cascades of RL stages two at a time:
# about 2.5 hours on 2 cores by an estimate, not a run (rule 26's hybrid
# cascade through MOPD took 18 minutes on a 2-core Xeon beside other runs).
# Run it again after a kill: finished stages are skipped. Then each RUNS/A/seed=S/report/report.json to
# docs/results/claims_<date>/hybrid_stage_order/A/seedS/report.json.
set -eu
RUNS=$1
PY=${PY:-python}
HYB="--config=configs/cascade.py --config.model=hybrid"
declare -A ORDER=(
  [default]=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf,long_context_rl,code_rl,swe_rl,swe_agent_rl
  [cascade1]=sft,rm,rlhf_branch,rlhf,if_rl,multi_domain_rl,mopd,long_context_rl,code_rl,swe_rl,swe_agent_rl
  [code_first]=sft,rm,rlhf_branch,code_rl,swe_rl,swe_agent_rl,if_rl,multi_domain_rl,mopd,rlhf,long_context_rl
)
mkdir -p "$RUNS"
for S in 0 1 2; do
  src=$RUNS/base/seed=$S
  $PY -m experiments.cascade $HYB --config.seed=$S --config.order=sft,rm \
    --workdir="$src" > "$RUNS/base_$S.log" 2>&1
  for A in default cascade1 code_first; do
    mkdir -p "$RUNS/$A/seed=$S"
    for st in sft rm; do
      [ -d "$RUNS/$A/seed=$S/$st" ] || cp -r "$src/$st" "$RUNS/$A/seed=$S/$st"
    done
  done
done
for S in 0 1 2; do
  for A in default cascade1 code_first; do echo "$A $S ${ORDER[$A]}"; done
done | xargs -P 2 -L 1 bash -c '
  A=$0; S=$1; O=$2
  echo "start $A seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.cascade '"$HYB"' --config.seed=$S --config.order=$O \
    --workdir='"$RUNS"'/$A/seed=$S > '"$RUNS"'/${A}_$S.log 2>&1
  echo "done $A seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
