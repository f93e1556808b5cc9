cd "$(git rev-parse --show-toplevel)"
for ops in xla auto; do
  for msa in on off; do
    if [[ $msa == off ]]; then export LIBTPU_INIT_ARGS=--xla_tpu_msa_inefficient_use_to_copy_ratio=1000; else unset LIBTPU_INIT_ARGS; fi
    echo "== cache_attention=$ops, MSA prefetch $msa"
    CASCADE_JAX_OPS=cache_attention=$ops PYTHONPATH=. .venv-tpu/bin/python docs/results/archive/plan_decode_layouts_2026-12-04/layouts.py decode 2>&1 | grep -v "^WARNING\|^E0000\|^===\|libtpu_init\|TPU_\|InitGoogle" | tail -2
  done
done
