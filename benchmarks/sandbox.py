"""Prints how many sandboxed test executions per second the pool sustains.

  python -m benchmarks.sandbox --config=benchmarks/configs/sandbox.py
"""

import os
import time

from absl import app
from ml_collections import config_flags

from cascade_jax import domains
from cascade_jax import sandbox
from cascade_jax import utils

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'benchmarks/configs/sandbox.py', 'Benchmark config.',
    lock_config=True)


def main(argv):
  del argv
  c = _CONFIG.value
  recs = domains.generate('swe', split='train', n=c.programs, seed=c.seed)
  programs = [r['response'] if i % 2 else r['buggy_code']
              for i, r in enumerate(recs)]
  jobs = [dict(program=p, tests='\n'.join(r['tests']),
               entry_points=[r['entry_point']]) for p, r in zip(programs, recs)]
  # Both ways of starting a process, side by side, alternating rounds (the
  # machine's speed drifts): forked from the fork server (the default) and
  # an interpreter of its own per process.
  if c.start not in ('fork', 'exec', 'both'):
    raise ValueError(f'--config.start={c.start!r}: fork, exec or both')
  modes = {'fork server': True, 'interpreter': False}
  if c.start != 'both':
    modes = {k: v for k, v in modes.items() if v == (c.start == 'fork')}
  boxes = {k: sandbox.Sandbox(workers=c.workers or None, fork_server=v)
           for k, v in modes.items()}
  runs = {k: [] for k in boxes}
  for _ in range(c.rounds):
    for k, box in boxes.items():
      box.run_tests_batch(jobs[:box.workers])  # warm-up
      t0 = time.perf_counter()
      results = box.run_tests_batch(jobs)
      runs[k].append((time.perf_counter() - t0, results))
  rows = []
  for k, rs in runs.items():
    dt, results = min(rs, key=lambda r: r[0])
    lat = sorted(r.seconds for r in results)
    passed = sum(r.passed for r in results)
    rows.append([k, len(jobs), boxes[k].workers, os.cpu_count(), dt,
                 len(jobs) / dt, lat[len(lat) // 2] * 1e3,
                 lat[int(len(lat) * 0.95)] * 1e3,
                 f'{passed} (expected {len(jobs) // 2})'])
  print(f'best of {c.rounds} rounds each, alternating')
  print(utils.format_table(
      ['start', 'programs', 'workers', 'cores', 'seconds', 'executions/s',
       'median ms', 'p95 ms', 'passed'], rows))
  for box in boxes.values():
    box.close()


if __name__ == '__main__':
  app.run(main)
