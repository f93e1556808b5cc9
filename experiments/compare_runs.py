"""Compares two cascade (or stage) run directories: every logged metric of every step, and every stage's final weights.

  python -m experiments.compare_runs --a=runs/before --b=runs/after
  python -m experiments.compare_runs --a=runs/before --b=runs/after --out=cmp.json

For a change that should not change the numbers (a refactor): per stage,
the metrics that differ (how many rows, the largest relative difference)
and how many tensors of the latest checkpoint (weights, optimizer state)
differ (the largest |a - b| / |a|). Timings
(`*_s`, `tokens_per_s`, `time`) are left out. Exits 1 when anything else
differs.
"""

import glob
import json
import os

import jax
import numpy as np
from absl import app
from absl import flags

from cascade_jax import checkpoint
from cascade_jax import utils

_A = flags.DEFINE_string('a', None, 'A run directory.', required=True)
_B = flags.DEFINE_string('b', None, 'The other run directory.', required=True)
_OUT = flags.DEFINE_string('out', None, 'If set, writes the comparison here '
                           '(JSON).')
_TIMING = ('_s', 'tokens_per_s')


def _stages(root: str) -> list[str]:
  """Stage directories (those with a metrics file), or the run itself."""
  if glob.glob(os.path.join(root, '*_metrics.jsonl')):
    return ['.']
  return sorted(d for d in os.listdir(root)
                if glob.glob(os.path.join(root, d, '*_metrics.jsonl')))


def compare_metrics(a: str, b: str) -> dict:
  """{file: {metric: [rows differing, largest relative difference]}}."""
  out = {}
  for f in sorted(glob.glob(os.path.join(a, '*_metrics.jsonl'))):
    rows_a = [json.loads(x) for x in open(f)]
    rows_b = [json.loads(x) for x in open(os.path.join(b, os.path.basename(f)))]
    diffs = {}
    if len(rows_a) != len(rows_b):
      diffs['(rows)'] = [abs(len(rows_a) - len(rows_b)), float('inf')]
    for ra, rb in zip(rows_a, rows_b):
      for k in sorted(set(ra) | set(rb)):
        if k == 'time' or k.endswith(_TIMING) or ra.get(k) == rb.get(k):
          continue
        d = diffs.setdefault(k, [0, 0.0])
        d[0] += 1
        try:
          d[1] = max(d[1], abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-30))
        except (KeyError, TypeError):
          d[1] = float('inf')
    out[os.path.basename(f)] = diffs
  return out


def compare_weights(a: str, b: str) -> tuple[int, int, float]:
  """(tensors that differ, tensors, largest |a - b| / |a|) of two runs' latest
  checkpoints: weights, optimizer state and step (any stage kind)."""
  la, lb = (jax.tree.leaves(checkpoint.Checkpointer(
      os.path.join(d, 'checkpoints')).read()[0]) for d in (a, b))
  if len(la) != len(lb):
    return max(len(la), len(lb)), max(len(la), len(lb)), float('inf')
  f64 = lambda x: np.asarray(x, np.float64)
  differ = sum(int(np.any(f64(x) != f64(y))) for x, y in zip(la, lb))
  worst = max(float(np.linalg.norm(f64(x) - f64(y)) /
                    max(np.linalg.norm(f64(x)), 1e-30)) for x, y in zip(la, lb))
  return differ, len(la), worst


def main(argv):
  del argv
  utils.quiet_logs()
  rows, report, same = [], {}, True
  for stage in _stages(_A.value):
    pa, pb = os.path.join(_A.value, stage), os.path.join(_B.value, stage)
    metrics = compare_metrics(pa, pb)
    weights = (compare_weights(pa, pb)
               if os.path.isdir(os.path.join(pa, 'checkpoints')) else None)
    report[stage] = dict(metrics=metrics, weights=weights)
    differ = {k: v for m in metrics.values() for k, v in m.items()}
    same &= not differ and (weights is None or weights[0] == 0)
    rows.append([stage, ', '.join(f'{k} ({n} rows, rel {r:.1e})'
                                  for k, (n, r) in differ.items()) or 'none',
                 '-' if weights is None else
                 f'{weights[0]} of {weights[1]} (rel {weights[2]:.1e})'])
  print(utils.format_table(['stage', 'metrics that differ',
                            'checkpoint tensors that differ'], rows))
  print('identical' if same else 'different')
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      json.dump(dict(a=_A.value, b=_B.value, identical=same, stages=report),
                f, indent=2)
  raise SystemExit(0 if same else 1)


if __name__ == '__main__':
  app.run(main)
