#!/bin/bash
# Rule 33 (docs/claims/33_sft_pref_hybrid.json): the hybrid main job with
# preference's SFT weight 1.5 alone (long-context RL at its default lr),
# cascade seeds 0, 1, 2, each from its own SFT; the default arm is rule
# 29's. From the repository root of a clean worktree:
#
#   bash docs/results/claims/2026-12-06/hybrid_sft_pref.sh RUNS [LANES]
#
# LANES cascades at a time (2 by default). Run it again after a kill:
# finished stages are skipped. Then each RUNS/pref1.5/seed=S/report/
# report.json to docs/results/claims/<date>/hybrid_sft_pref/pref1.5/seedS/.
set -eu
RUNS=$1
LANES=${2:-2}
PY=${PY:-python}
mkdir -p "$RUNS/pref1.5"
printf '%s\n' 0 1 2 | xargs -P "$LANES" -I{} bash -c '
  S={}; R='"$RUNS"'
  echo "start pref1.5 seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.cascade --config=configs/cascade.py \
    --config.model=hybrid --config.seed=$S \
    --config.stages.sft.data.sources.preference.weight=1.5 \
    --workdir="$R/pref1.5/seed=$S" > "$R/pref1.5_$S.log" 2>&1
  echo "done pref1.5 seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
