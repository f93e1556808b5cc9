#!/bin/bash
# Rule 12 (docs/claims/12_stage_order.json): three stage orders of the main
# job per seed, from one SFT and reward model per seed.
#
#   bash docs/results/claims/2026-12-04/stage_order/run.sh RUNS [SEED_RUN_0 SEED_RUN_1 SEED_RUN_2]
#
# Run from the repository root of a clean worktree. SEED_RUN_S (optional): a
# finished main job of seed S whose sft and rm stages are copied into each
# arm (the same stages the arm would make, prompt for prompt: the measure
# voids the comparison otherwise); without it each seed's SFT and reward
# model are made first (--config.order=sft,rm). Two runs at a time (2 cores:
# two main jobs side by side take about 1.25 x one alone). Then each
# RUNS/A/seed=S/report/report.json goes to
# docs/results/claims/<date>/stage_order/A/seedS/report.json.
# CASCADE_FLAGS: more flags for every cascade (rule 29, the hybrid:
# docs/results/claims/2026-12-05/hybrid_stage_order.sh); rule 12 ran
# without.
set -eu
RUNS=$1; shift
SOURCES=("$@")
PY=${PY:-python}
FLAGS=${CASCADE_FLAGS:-}
declare -A ORDER=(
  [default]=sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf,long_context_rl,code_rl,swe_rl,swe_agent_rl
  [cascade1]=sft,rm,rlhf_branch,rlhf,if_rl,multi_domain_rl,mopd,long_context_rl,code_rl,swe_rl,swe_agent_rl
  [code_first]=sft,rm,rlhf_branch,code_rl,swe_rl,swe_agent_rl,if_rl,multi_domain_rl,mopd,rlhf,long_context_rl
)
mkdir -p "$RUNS"
for S in 0 1 2; do
  src=${SOURCES[$S]:-}
  if [ -z "$src" ]; then
    src=$RUNS/base/seed=$S
    $PY -m experiments.cascade --config=configs/cascade.py $FLAGS \
      --config.seed=$S --config.order=sft,rm --workdir="$src" \
      > "$RUNS/base_$S.log" 2>&1
  fi
  for A in default cascade1 code_first; do
    mkdir -p "$RUNS/$A/seed=$S"
    for st in sft rm; do
      [ -d "$RUNS/$A/seed=$S/$st" ] || cp -r "$src/$st" "$RUNS/$A/seed=$S/$st"
    done
  done
done
for S in 0 1 2; do
  for A in default cascade1 code_first; do echo "$A $S"; done
done | xargs -P 2 -L 1 bash -c '
  A=$0; S=$1
  declare -A O=([default]='"${ORDER[default]}"' [cascade1]='"${ORDER[cascade1]}"' [code_first]='"${ORDER[code_first]}"')
  echo "start $A seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.cascade --config=configs/cascade.py '"$FLAGS"' --config.seed=$S \
    --config.order=${O[$A]} --workdir='"$RUNS"'/$A/seed=$S \
    > '"$RUNS"'/${A}_$S.log 2>&1
  echo "done $A seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
