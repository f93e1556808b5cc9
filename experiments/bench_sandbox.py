"""Prints how many sandboxed test executions per second the pool sustains.

  python -m experiments.bench_sandbox --config=configs/bench_sandbox.py
"""

import os
import time

from absl import app
from ml_collections import config_flags

from cascade_jax import domains
from cascade_jax import sandbox
from cascade_jax import utils

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/bench_sandbox.py', 'Benchmark config.',
    lock_config=True)


def main(argv):
  del argv
  c = _CONFIG.value
  recs = domains.generate('swe', split='train', n=c.programs, seed=c.seed)
  programs = [r['response'] if i % 2 else r['buggy_code']
              for i, r in enumerate(recs)]
  box = sandbox.Sandbox(workers=c.workers or None)
  jobs = [dict(program=p, tests='\n'.join(r['tests']),
               entry_points=[r['entry_point']]) for p, r in zip(programs, recs)]
  box.run_tests_batch(jobs[:box.workers])  # warm-up
  t0 = time.perf_counter()
  results = box.run_tests_batch(jobs)
  dt = time.perf_counter() - t0
  lat = sorted(r.seconds for r in results)
  passed = sum(r.passed for r in results)
  print(utils.format_table(
      ['programs', 'workers', 'cores', 'seconds', 'executions/s',
       'median ms', 'p95 ms', 'passed'],
      [[len(jobs), box.workers, os.cpu_count(), dt, len(jobs) / dt,
        lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.95)] * 1e3,
        f'{passed} (expected {len(jobs) // 2})']]))
  box.close()


if __name__ == '__main__':
  app.run(main)
