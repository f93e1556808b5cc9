"""Merges this directory's plan runs into results.json (one table).

The first run (part1: v5p-16 sft, grpo) was compiled before the counted
FLOPs included attention (05a363e); its `model_flops` are recounted here
with `aot.model_flops` at the same shapes. Memory figures are the
compiler's, untouched.

  python docs/results/archive/plan_slices_2026-12-02/merge.py
  python -m experiments.plan --config=configs/plan.py:qwen3_30b_a3b \
      --from_results=docs/results/archive/plan_slices_2026-12-02/results.json
"""
import json
import os

from configs import plan as plan_config
from cascade_jax import aot

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
  c = plan_config.get_config('qwen3_30b_a3b')
  cfg = aot.model_config(c)
  rows = []
  for part in sorted(p for p in os.listdir(HERE) if p.startswith('part')):
    with open(os.path.join(HERE, part, 'results.json')) as f:
      got = json.load(f)
    for r in got:
      if part == 'part1':
        devices = int(r['mesh'].split('(')[1].rstrip(')'))
        shapes = aot.mesh_shapes(c.shapes.to_dict(), devices)
        r['model_flops'] = aot.model_flops(
            r['step'], cfg, r['tokens'],
            aot.attention_context(r['step'], shapes)) / devices
      rows.append(r)
  with open(os.path.join(HERE, 'results.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  print(f'{len(rows)} rows')


if __name__ == '__main__':
  main()
