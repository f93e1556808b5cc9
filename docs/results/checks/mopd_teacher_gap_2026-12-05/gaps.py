"""The main job's MOPD stage per domain: its teacher's pass@1, the student's start, MOPD's end.

MOPD distils each domain from a teacher (configs/cascade.py MOPD_TEACHERS):
an earlier checkpoint of the same run. Where the teacher scores no higher
than the student's start, distilling it cannot lift the domain. Reads the
committed main-job reports (attention: the forgetting sweep; hybrid: rule
15's runs) and prints, per model, seed and domain, the teacher's lead over
the start and MOPD's change, each with the paired SE over prompts (2 SE).

  python docs/results/checks/mopd_teacher_gap_2026-12-05/gaps.py > docs/results/checks/mopd_teacher_gap_2026-12-05/gaps.md
"""
import glob
import json
import sys

sys.path.insert(0, '.')
from cascade_jax import domains  # pylint: disable=g-import-not-at-top,wrong-import-position

RUNS = {
    'attention': 'docs/results/claims/2026-12-03/forgetting/seed*/report.json',
    'hybrid': 'docs/results/claims/2026-12-04/hybrid/seed*/report.json',
}


def _change(a: dict, b: dict, domain: str) -> tuple[float, float]:
  """b's pass@1 minus a's in `domain`, and 2 x its paired SE over prompts
  (as the cascade report computes it)."""
  sa, sb = a['scores'][domain], b['scores'][domain]
  se = domains.paired_se(list(sa['prompt_pass'].items()),
                         list(sb['prompt_pass'].items()))
  return sb['pass_rate'] - sa['pass_rate'], 2 * se


def main():
  print('| model | seed | domain | teacher | teacher - start (2 SE) | MOPD end - start (2 SE) |')
  print('|---|---|---|---|---:|---:|')
  for name, pattern in RUNS.items():
    for f in sorted(glob.glob(pattern)):
      r = json.load(open(f))
      st = {s['name']: s for s in r['stages']}
      seed = f.split('/')[-2]
      mopd = st['mopd']
      start = st[mopd['init_from']]
      for dom, teacher in sorted(mopd['teachers'].items()):
        gap, gse = _change(start, st[teacher], dom)
        ch, cse = _change(start, mopd, dom)
        print(f'| {name} | {seed} | {dom} | {teacher} | {gap:+.3f} ({gse:.3f}) '
              f'| {ch:+.3f} ({cse:.3f}) |')


if __name__ == '__main__':
  main()
