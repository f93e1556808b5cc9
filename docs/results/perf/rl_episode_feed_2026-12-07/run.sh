#!/bin/bash
# The rule in README.md: the main job's two episode stages rerun from its
# checkpoints with rl.episode_slots=32 before (the gather feed, worktree
# /work/wt_before) and after (in place, /work/wt_after), then the fixed
# batch (after), one after the other.
#
#   bash docs/results/perf/rl_episode_feed_2026-12-07/run.sh BASE OUT
set -u
BASE=$1; OUT=$2
PY=${PY:-/work/main/.venv/bin/python}
mkdir -p "$OUT"
for stage in multi_domain_rl swe_agent_rl; do
  for arm in before after fixed; do
    wt=/work/wt_after; slots=32
    [ $arm = before ] && wt=/work/wt_before
    [ $arm = fixed ] && slots=0
    echo "start $stage $arm $(date -u +%FT%TZ) $(git -C $wt rev-parse --short HEAD)"
    (cd $wt && $PY -m experiments.rerun_stage --config=configs/cascade.py --run="$BASE" \
      --stage=$stage --workdir="$OUT/${stage}_$arm" --config.eval_n=16 \
      --config.stages.$stage.rl.episode_slots=$slots > "$OUT/${stage}_$arm.log" 2>&1)
    echo "done $stage $arm rc=$? $(date -u +%FT%TZ)"
  done
done
