#!/bin/bash
# Rule 29 (docs/claims/29_stage_order_hybrid.json): rule 12's three stage
# orders on the hybrid, per seed from one SFT and reward model: rule 12's
# script with the hybrid's flag. From the repository root of a clean
# worktree:
#
#   bash docs/results/claims/2026-12-05/hybrid_stage_order.sh RUNS
#
# Three hybrid SFTs, then nine hybrid cascades of RL stages two at a time:
# about 2.5 hours on 2 cores by an estimate, not a run (rule 26's hybrid
# cascade through MOPD took 18 minutes on a 2-core Xeon beside other runs).
# Run it again after a kill: finished stages are skipped. Then each
# RUNS/A/seed=S/report/report.json to
# docs/results/claims/<date>/hybrid_stage_order/A/seedS/report.json.
set -eu
CASCADE_FLAGS=--config.model=hybrid exec bash \
  "$(dirname "$0")/../claims_2026-12-04/stage_order/run.sh" "$1"
