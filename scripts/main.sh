#!/usr/bin/env bash
# The main job: the tiny cascade end to end (SFT -> ... -> SWE RL) on the CPU,
# then its report. Extra arguments go to the launcher, e.g. --workdir=... or
# --config.order=...; run it again after a kill and it resumes.
source "$(dirname "$0")/_setup.sh"
exec python -m experiments.cascade --config=configs/cascade.py "$@"
