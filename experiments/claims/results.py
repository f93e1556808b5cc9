"""Reading the committed results: the helpers every claim measure uses."""

from __future__ import annotations

import json
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SHORT = {'instruction_following': 'IF', 'multi_domain': 'multi',
         'long_context': 'long', 'preference': 'pref'}


def load(rel: str) -> dict:
  with open(os.path.join(ROOT, rel)) as f:
    return json.load(f)


def se_change(a: dict, b: dict) -> float:
  """Paired standard error of b - a over the prompts both scored."""
  pa, pb = a.get('prompt_pass') or {}, b.get('prompt_pass') or {}
  keys = sorted(set(pa) & set(pb))
  if len(keys) > 1:
    d = np.asarray([pb[k] - pa[k] for k in keys], np.float64)
    return float(d.std(ddof=1) / np.sqrt(len(d)))
  return float(np.hypot(a.get('pass_se', np.nan), b.get('pass_se', np.nan)))


def macro(rows, key: str = 'change') -> tuple[float, float]:
  """The mean of rows' `key` over domains (each on its own eval prompts)
  and its SE: the domains' paired SEs (`se`) combined as independent."""
  rows = list(rows)
  return (float(np.mean([r[key] for r in rows])),
          float(np.sqrt(sum(r['se'] ** 2 for r in rows)) / len(rows)))


def row(rerun: dict, domain: str) -> dict:
  return next(r for r in rerun['rows'] if r['domain'] == domain)


def stage_changes(rep: dict, own: bool) -> list[dict]:
  """Each RL stage's change from the stage it starts from, in its own
  domains (own) or in every other domain, in the stages' order."""
  by = {s['name']: s for s in rep['stages']}
  out = []
  for s in rep['stages']:
    if s['kind'] not in ('grpo', 'mopd') or not s.get('scores'):
      continue
    start = by[s['init_from']]
    domains = (list(s['domains']) if own else
               sorted(set(s['scores']) - set(s['domains'])))
    for d in domains:
      if d not in start.get('scores', {}):
        continue
      a, b = start['scores'][d], s['scores'][d]
      out.append(dict(stage=s['name'], domain=d,
                      change=b['pass_rate'] - a['pass_rate'],
                      se=se_change(a, b)))
  return out
