"""The stage-order runs as tables: each arm's last stage per domain and seed,
and each order's difference from the default with its paired SE.

  python docs/results/claims/2026-12-04/stage_order/table.py [DIR]   # > table.txt

DIR (default: this folder) holds ARM/seedS/report.json.
"""

import glob
import json
import os
import sys

import numpy as np

from cascade_jax import domains

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ('default', 'cascade1', 'code_first')


def last(path):
  with open(path) as f:
    rep = json.load(f)
  return [s for s in rep['stages'] if s.get('scores') and not s['branch']][-1]


def main():
  root = sys.argv[1] if len(sys.argv) > 1 else HERE
  runs = {}
  for a in ARMS:
    for p in sorted(glob.glob(os.path.join(root, a, 'seed*', 'report.json'))):
      runs.setdefault(os.path.basename(os.path.dirname(p)), {})[a] = last(p)
  doms = sorted(next(iter(runs.values()))['default']['scores'])
  short = {'instruction_following': 'IF', 'multi_domain': 'multi',
           'long_context': 'long', 'preference': 'pref'}
  print('Last main-line stage, pass@1 per domain (macro: mean over domains)')
  print(f"{'seed':<6}{'order':<12}{'last stage':<17}"
        + ''.join(f'{short.get(d, d):>10}' for d in doms) + f"{'macro':>8}")
  for seed, arms in sorted(runs.items()):
    for a in ARMS:
      if a in arms:
        sc = arms[a]['scores']
        print(f'{seed:<6}{a:<12}{arms[a]["name"]:<17}'
              + ''.join(f"{sc[d]['pass_rate']:>10.3f}" for d in doms)
              + f"{np.mean([sc[d]['pass_rate'] for d in doms]):>8.3f}")
  print('\nDefault minus each order (paired SE over prompts; * beyond 2 SE)')
  print(f"{'seed':<6}{'order':<12}" + ''.join(f'{short.get(d, d):>12}'
                                              for d in doms) + f"{'macro':>16}")
  for seed, arms in sorted(runs.items()):
    ref = arms['default']['scores']
    for a in ARMS[1:]:
      if a not in arms:
        continue
      cells, ses = [], []
      for d in doms:
        x, y = arms[a]['scores'][d], ref[d]
        diff = y['pass_rate'] - x['pass_rate']
        se = domains.paired_se(list(x['prompt_pass'].items()),
                               list(y['prompt_pass'].items()))
        ses.append(se)
        cells.append(f"{diff:+.3f}{'*' if abs(diff) > 2 * se else ' '}")
      macro = np.mean([ref[d]['pass_rate'] - arms[a]['scores'][d]['pass_rate']
                       for d in doms])
      se = np.sqrt(np.sum(np.square(ses))) / len(doms)
      print(f'{seed:<6}{a:<12}' + ''.join(f'{c:>12}' for c in cells)
            + f"{macro:>+9.3f} ({se:.3f}){'*' if abs(macro) > 2 * se else ''}")


if __name__ == '__main__':
  main()
