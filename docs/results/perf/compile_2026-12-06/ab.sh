cd .
for v in 0.5 0; do s=$(date +%s); MIN_CACHE_S=$v PYTHONPATH=docs/results/perf/compile_2026-12-06 .venv/bin/python -m pytest -p mincache -n 2 -q tests/test_rl.py tests/test_ops.py tests/test_rollout.py tests/test_sharding.py tests/test_rl_step.py tests/test_hybrid.py -m "not slow and not gpu" 2>&1 | tail -1; echo "min=$v $(( $(date +%s) - s )) s"; done
