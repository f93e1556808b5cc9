"""The registered comparison (README.md): a seed's main job at RLHF KL 0.03
(report.json here for seed 0, seedS/report.json for the others) against the
committed one at 0.1.

  python docs/results/claims/2026-12-04/rlhf_kl_main/compare.py [--seed=S]
"""

import argparse
import json
import os

from cascade_jax import domains

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, '..', '..', 'claims_2026-12-03', 'forgetting',
                    'seed{}', 'report.json')


def stages(path):
  with open(path) as f:
    return {s['name']: s for s in json.load(f)['stages']}


def change(a, b, dom):
  """(0.1's pass@1, 0.03's, change, paired SE) in `dom`."""
  x, y = a['scores'][dom], b['scores'][dom]
  se = domains.paired_se(list(x['prompt_pass'].items()),
                         list(y['prompt_pass'].items()))
  return x['pass_rate'], y['pass_rate'], y['pass_rate'] - x['pass_rate'], se


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--seed', type=int, default=0)
  seed = parser.parse_args().seed
  new_path = (os.path.join(HERE, 'report.json') if seed == 0 else
              os.path.join(HERE, f'seed{seed}', 'report.json'))
  old, new = stages(BASE.format(seed)), stages(new_path)
  untouched = ('sft', 'if_rl', 'multi_domain_rl')
  same = {s: all(old[s]['scores'][d]['prompt_pass'] ==
                 new[s]['scores'][d]['prompt_pass'] for d in old[s]['scores'])
          for s in untouched}
  print('stages neither KL touches, equal prompt for prompt:', same)
  if not all(same.values()):
    print('VOID: the runs differ before RLHF')
    return
  print(f"{'stage':<14}{'domain':<24}{'KL 0.1':>8}{'KL 0.03':>9}"
        f"{'change':>9}{'2 SE':>8}")
  rows = {}
  for st, doms in (('rlhf_branch', ['preference']), ('rlhf', ['preference']),
                   ('swe_agent_rl', sorted(new['swe_agent_rl']['scores']))):
    for d in doms:
      a, b, c, se = change(old[st], new[st], d)
      rows[(st, d)] = (c, se)
      flag = ' *' if abs(c) > 2 * se else ''
      print(f'{st:<14}{d:<24}{a:>8.3f}{b:>9.3f}{c:>+9.3f}{2 * se:>8.3f}{flag}')
  pref_ok = rows[('rlhf', 'preference')][0] >= 0
  lower = [d for (st, d), (c, se) in rows.items()
           if st == 'swe_agent_rl' and c < -2 * se]
  print(f"(a) preference after rlhf at 0.03 >= 0.1's: {pref_ok}")
  print(f'(b) last-stage domains lower at 0.03 beyond 2 SE: {lower or "none"}')
  print('verdict (one seed):', 'the default becomes 0.03' if pref_ok and
        not lower else 'the default stays 0.1')


if __name__ == '__main__':
  main()
