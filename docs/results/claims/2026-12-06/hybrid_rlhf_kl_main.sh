#!/bin/bash
# Rule 30 (docs/claims/30_rlhf_kl_main_hybrid.json): the hybrid main job at
# RLHF KL 0.03 (both RLHF stages) per seed, from the SFT and reward model of
# rule 29's base run of that seed; its 0.1 jobs are rule 29's default arm.
# From the repository root of a clean worktree, once rule 29 has started:
#
#   bash docs/results/claims/2026-12-06/hybrid_rlhf_kl_main.sh RUNS [LANES]
#
# RUNS: rule 29's (hybrid_stage_order.sh RUNS); seed S starts once rule
# 29's base run of seed S has finished (its report). LANES runs at a time
# (1 by default, beside rule 29's two). Run it
# again after a kill: finished stages are skipped. Then each
# RUNS/kl0.03/seed=S/report/report.json to
# docs/results/claims/<date>/hybrid_rlhf_kl_main/seedS/report.json.
set -eu
RUNS=$1
LANES=${2:-1}
PY=${PY:-python}
printf '%s\n' 0 1 2 | xargs -P "$LANES" -I{} bash -c '
  S={}; R='"$RUNS"'
  [ -f "$R/base/seed=$S/report/report.json" ] || {
    echo "no $R/base/seed=$S/report/report.json: rule 29 has not made seed $S'"'"'s SFT" >&2; exit 255; }
  mkdir -p "$R/kl0.03/seed=$S"
  for st in sft rm; do
    [ -d "$R/kl0.03/seed=$S/$st" ] || cp -r "$R/base/seed=$S/$st" "$R/kl0.03/seed=$S/$st"
  done
  echo "start kl0.03 seed $S $(date -u +%FT%TZ)"
  '"$PY"' -m experiments.cascade --config=configs/cascade.py --config.model=hybrid \
    --config.seed=$S --config.stages.rlhf.rl.kl_coef=0.03 \
    --config.stages.rlhf_branch.rl.kl_coef=0.03 \
    --workdir="$R/kl0.03/seed=$S" > "$R/kl0.03_$S.log" 2>&1
  echo "done kl0.03 seed $S rc=$? $(date -u +%FT%TZ)"'
echo "all done $(date -u +%FT%TZ)"
