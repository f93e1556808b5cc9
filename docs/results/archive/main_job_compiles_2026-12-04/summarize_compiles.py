"""Compile seconds by program and by stage, from a main job's log run with JAX_LOG_COMPILES=1.

  python docs/results/archive/main_job_compiles_2026-12-04/summarize_compiles.py LOG
"""

import collections
import re
import sys


def main(path):
  stage = 'pre'
  by_stage_fn = collections.defaultdict(lambda: [0, 0.0])
  by_fn = collections.defaultdict(lambda: [0, 0.0])
  per_stage = collections.defaultdict(float)
  with open(path) as f:
    for line in f:
      m = re.search(r'\[cascade\] stage \d+/\d+ (\S+)', line)
      if m:
        stage = m.group(1)
      m = re.search(r'Finished XLA compilation of (\S+) in ([\d.]+)', line)
      if m:
        fn, t = m.group(1), float(m.group(2))
        for table, key in ((by_stage_fn, (stage, fn)), (by_fn, fn)):
          table[key][0] += 1
          table[key][1] += t
        per_stage[stage] += t
  for k, (n, t) in sorted(by_fn.items(), key=lambda kv: -kv[1][1])[:15]:
    print(f'{t:7.1f} {n:3d} {k}')
  print({k: round(v, 1) for k, v in per_stage.items()},
        round(sum(per_stage.values()), 1), sum(n for n, _ in by_fn.values()))
  for k, (n, t) in sorted(by_stage_fn.items(),
                          key=lambda kv: -kv[1][1])[:25]:
    print(f'{t:7.1f} {n:3d} {k}')


if __name__ == '__main__':
  main(sys.argv[1])
