#!/bin/bash
# Rule 31 (docs/claims/31_settings_hybrid.json): the hybrid main job with
# preference's SFT weight 1.5 and long-context RL at lr 1e-4, cascade seeds
# 0, 1, 2, each from its own SFT; the default arm is rule 29's. From the
# repository root of a clean worktree:
#
#   bash docs/results/claims/2026-12-06/hybrid_settings.sh RUNS [LANES]
#
# LANES runs at a time (2 by default: two hybrid cascades side by side on
# 2 cores). Run it again after a kill: finished stages are skipped. Then
# each RUNS/tuned/seed=S/report/report.json to
# docs/results/claims/<date>/hybrid_settings/tuned/seedS/report.json.
set -eu
RUNS=$1
LANES=${2:-2}
PY=${PY:-python}
mkdir -p "$RUNS/tuned"
printf '%s\n' 0 1 2 | xargs -P "$LANES" -I{} bash -c '
  S={}; R='"$RUNS"'
  echo "start tuned seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.cascade --config=configs/cascade.py --config.model=hybrid \
    --config.seed=$S --config.stages.sft.data.sources.preference.weight=1.5 \
    --config.stages.long_context_rl.optim.lr=1e-4 \
    --workdir="$R/tuned/seed=$S" > "$R/tuned_$S.log" 2>&1
  echo "done tuned seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
