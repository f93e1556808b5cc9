#!/bin/bash
# The rule in README.md: two episode stages of the main job rerun from its
# checkpoints with rl.episode_slots 0 (fixed batch), 32, 128, 0 again, one
# after the other. From the repository root of a clean worktree:
#
#   bash docs/results/archive/rl_episode_slots_2026-12-05/run.sh BASE OUT
#
# BASE: the main job's workdir through swe_rl; OUT: where the reruns go.
set -eu
BASE=$1; OUT=$2
PY=${PY:-python}
for stage in multi_domain_rl swe_agent_rl; do
  for s in 0 32 128 0b; do
    echo "start $stage $s $(date -u +%FT%TZ)"
    $PY -m experiments.rerun_stage --config=configs/cascade.py --run="$BASE" \
      --stage=$stage --workdir="$OUT/${stage}_$s" --config.eval_n=16 \
      --config.stages.$stage.rl.episode_slots=${s%b} > "$OUT/${stage}_$s.log" 2>&1
    echo "done $stage $s rc=$? $(date -u +%FT%TZ)"
  done
done
