#!/bin/bash
# Rule 21 (docs/claims/21_sft_mix_hybrid.json): the hybrid's SFT at
# preference weight 1.5 against the default 0.5, cascade seeds 0, 1, 2
# (SFT alone, scored as the cascade scores it). From the repository root of
# a clean worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_sft_mix.sh RUNS
#
# Then each RUNS/ARM/seedS/report/report.json to
# docs/results/claims/<date>/hybrid_sft_mix/ARM/seedS/report.json.
set -eu
RUNS=$1
PY=${PY:-python}
mkdir -p "$RUNS"
for S in 0 1 2; do
  for A in default pref1.5; do
    case $A in
      default) X=() ;;
      pref1.5) X=(--config.stages.sft.data.sources.preference.weight=1.5) ;;
    esac
    [[ -f "$RUNS/$A/seed$S/report/report.json" ]] && continue
    echo "start $A seed $S $(date -u +%FT%TZ)"
    $PY -m experiments.cascade --config=configs/cascade.py \
      --config.model=hybrid --config.order=sft --config.seed=$S "${X[@]}" \
      --workdir="$RUNS/$A/seed$S" > "$RUNS/$A.seed$S.log" 2>&1
    echo "done $A seed $S $(date -u +%FT%TZ)"
  done
done
echo "all done $(date -u +%FT%TZ)"
