#!/bin/bash
# Rule 32 (docs/claims/32_mopd_hybrid.json): the hybrid main job's MOPD
# stage rerun from multi_domain_rl under three settings, one rerun per
# cascade seed 0, 1, 2 of rule 29's default arm. From the repository root
# of a clean worktree:
#
#   bash docs/results/claims/2026-12-06/hybrid_mopd.sh RUNS OUT [LANES]
#
# RUNS: rule 29's runs (RUNS/default/seed=S); LANES reruns at a time (2 by
# default). Run it again after a kill: finished reruns are skipped. Then
# each OUT/ARM/seedS/rerun.json to
# docs/results/claims/<date>/hybrid_mopd/ARM/seedS/rerun.json.
set -eu
RUNS=$1
OUT=$2
LANES=${3:-2}
PY=${PY:-python}
mkdir -p "$OUT"
for S in 0 1 2; do
  for A in default steps36 lr5e-4; do
    echo "$A $S"
  done
done | xargs -P "$LANES" -L 1 bash -c '
  A=$0; S=$1; R='"$RUNS"'; O='"$OUT"'
  case $A in
    default) X="" ;;
    steps36) X="--config.stages.mopd.steps=36" ;;
    lr5e-4) X="--config.stages.mopd.optim.lr=5e-4" ;;
  esac
  [[ -f "$O/$A/seed$S/rerun.json" ]] && exit 0
  echo "start $A seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.rerun_stage --config=configs/cascade.py \
    --config.model=hybrid --config.seed=$S --run="$R/default/seed=$S" \
    --stage=mopd $X --workdir="$O/$A/seed$S" > "$O/$A.seed$S.log" 2>&1
  echo "done $A seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
