#!/usr/bin/env bash
# The main job. Until the cascade lands (issue 6) it is the MoE benchmark.
source "$(dirname "$0")/_setup.sh"
exec python -m experiments.bench_moe --config=configs/bench_moe.py "$@"
