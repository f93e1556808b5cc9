"""The verdict and measure functions of rules decided before those functions changed, as they were then.

A rule is decided by the code it was registered with: when a verdict or
measure function changes after a rule's first result, the rule keeps the
old one, here, named by the commit of that first result (`history.check`
compares each with the code at that commit). Later rules use the new one.
"""

from __future__ import annotations

import os

import numpy as np

from experiments.claims.results import load
from experiments.claims.results import se_change
from experiments.claims.results import SHORT


def verdict_mixing_forgets_less_2a5f69b(rule: dict, m: dict) -> str:
  """The mixed arm above the alone arm in every seed in each of
  rule['domains'], and its own domain (rule['own']) up beyond threshold x
  the paired SE in rule['in_seeds'] seeds: 'holds'; above in some domain,
  or in all without the own lift: 'partly'; else 'no'."""
  arms = m['domains']
  seeds = min((len(arms[d][a]) for d in rule['domains']
               for a in ('alone', 'mixed')), default=0)
  if seeds < rule['seeds']:
    return f"open ({seeds} of {rule['seeds']} seeds)"
  above = [d for d in rule['domains'] if all(
      x['change'] > y['change']
      for x, y in zip(arms[d]['mixed'], arms[d]['alone'], strict=True))]
  lifted = sum(c['change'] > rule['threshold'] * c['se']
               for c in m['own']['mixed']) >= rule['in_seeds']
  if lifted and set(above) == set(rule['domains']):
    return 'holds'
  if above:
    return ('partly: ' + ', '.join(above) + ' kept'
            + ('' if lifted else f", {rule['own']} not lifted"))
  return 'no'


def lc_mix_2a5f69b(files):
  """Long-context RL alone and mixed (files .../{alone,mixed}/seedS/
  rerun.json): every domain's change per arm, mean over seeds."""
  runs = {}                                    # arm -> seed -> rerun.json
  for f in files:
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    runs.setdefault(arm, {})[os.path.basename(os.path.dirname(f))] = load(f)
  rows = {arm: [{r['domain']: r for r in doc['rows']}
                for _, doc in sorted(seeds.items())]
          for arm, seeds in runs.items()}
  doms = sorted({d for arm in rows.values() for seed in arm for d in seed})
  mean = lambda xs: float(np.mean(xs)) if xs else float('nan')
  out = {d: {arm: [seed[d] for seed in rows.get(arm, [])]
             for arm in ('alone', 'mixed')} for d in doms}
  parts = []
  for d in doms:
    a, m = out[d]['alone'], out[d]['mixed']
    above = sum(x['change'] > y['change'] for x, y in zip(m, a))
    parts.append(f"{SHORT.get(d, d)} {mean([r['change'] for r in a]):+.3f} "
                 f"alone / {mean([r['change'] for r in m]):+.3f} mixed "
                 f'(mixed above in {above} of {min(len(a), len(m))})')
  text = ('from rlhf, 30 steps, mean change over seeds: ' + ', '.join(parts))
  return text, dict(domains=out, own=out.get('long_context', {}))


def stage_order_6528b40(files):
  """The stage orders (files .../stage_order/ARM/seedS/report.json): per
  seed, the default order's last stage against each other order's, the
  macro mean over domains and per domain, paired over prompts."""
  runs = {}                                  # seed -> arm -> report
  for f in files:
    seed = os.path.basename(os.path.dirname(f))
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    runs.setdefault(seed, {})[arm] = load(f)
  last = lambda rep: [s for s in rep['stages']
                      if s.get('scores') and not s.get('branch')][-1]
  diffs, macro, per_domain, void = {}, {}, {}, []
  for seed, arms in sorted(runs.items()):
    if 'default' not in arms:
      continue
    sft = {a: rep['stages'][0]['scores'] for a, rep in arms.items()}
    for a in arms:
      if any(sft[a][d].get('prompt_pass') != s['prompt_pass']
             for d, s in sft['default'].items()):
        void.append(f'{seed}: {a} starts from another SFT')
    ref = last(arms['default'])['scores']
    for a, rep in sorted(arms.items()):
      end = last(rep)['scores']
      macro.setdefault(a, []).append(
          float(np.mean([end[d]['pass_rate'] for d in ref])))
      if a == 'default':
        continue
      ds = {d: dict(diff=ref[d]['pass_rate'] - end[d]['pass_rate'],
                    se=se_change(end[d], ref[d])) for d in ref}
      for d, x in ds.items():
        per_domain.setdefault(a, {}).setdefault(d, []).append(x)
      diffs.setdefault(a, []).append(dict(
          diff=float(np.mean([x['diff'] for x in ds.values()])),
          se=float(np.sqrt(sum(x['se'] ** 2 for x in ds.values()))
                   / len(ds))))
  parts = []
  for a, ds in sorted(diffs.items()):
    beyond = lambda xs, sign: sum(sign * x['diff'] > 2 * x['se'] for x in xs)
    dom = [f'{SHORT.get(d, d)} {np.mean([x["diff"] for x in xs]):+.3f}'
           for d, xs in sorted(per_domain[a].items())
           if beyond(xs, 1) >= 2 or beyond(xs, -1) >= 2]
    parts.append(
        f'{a}: ' + ', '.join(f"{x['diff']:+.3f} (SE {x['se']:.3f})"
                             for x in ds)
        + (f' (default ahead by seed; domains apart beyond 2 SE in 2 or more '
           f"seeds: {', '.join(dom) if dom else 'none'})"))
  text = ('last stage, macro mean over domains, default order minus '
          + '; '.join(parts) + '; mean macro pass@1: '
          + ', '.join(f'{a} {np.mean(v):.3f}' for a, v in sorted(macro.items()))
          + (f" (void: {'; '.join(void)})" if void else ''))
  return text, dict(diffs=diffs, macro=macro, per_domain=per_domain,
                    void='; '.join(void))


def verdict_setting_chosen_1e8e75e(rule: dict, m: dict) -> str:
  """A stage's setting chosen among arms (m['arms']: per arm, per seed the
  preference change and SE, and the math change and SE). An arm other
  than rule['default'] qualifies if its preference change is up beyond
  threshold x SE in rule['in_seeds'] or more seeds, its mean above the
  default's, and its mean math change not below the default's by more than
  threshold x its mean math SE; the qualifying arm with the highest mean
  preference change is chosen. Else the default stays: 'holds at the
  default' if it is up that far in in_seeds or more seeds."""
  arms, t, k = m['arms'], rule['threshold'], rule['in_seeds']
  want = rule.get('arms') or sorted(arms)
  done = {a: len(arms.get(a, [])) for a in want}
  if min(done.values(), default=0) < rule['seeds']:
    return 'open (' + ', '.join(f'{a} {n} of {rule["seeds"]}'
                                for a, n in done.items()) + ' seeds)'
  mean = lambda a, key: sum(r[key] for r in arms[a]) / len(arms[a])
  ups = lambda a: sum(r['pref'] > t * r['pref_se'] for r in arms[a])
  base = rule['default']
  ok = [a for a in want if a != base and ups(a) >= k
        and mean(a, 'pref') > mean(base, 'pref')
        and mean(a, 'math') >= mean(base, 'math') - t * mean(a, 'math_se')]
  if ok:
    return f"{max(ok, key=lambda a: mean(a, 'pref'))} becomes the setting"
  if ups(base) >= k:
    return 'holds at the default'
  return 'not made to work by lr, KL or steps at this scale'


# {rule id: {'verdict' or 'measure': the function that decides it}}.
FROZEN = {
    '11_long_context_mix': dict(verdict=verdict_mixing_forgets_less_2a5f69b,
                                measure=lc_mix_2a5f69b),
    '12_stage_order': dict(measure=stage_order_6528b40),
    '17_hybrid_rlhf': dict(verdict=verdict_setting_chosen_1e8e75e),
    '22_lc_mix_hybrid': dict(verdict=verdict_mixing_forgets_less_2a5f69b,
                             measure=lc_mix_2a5f69b),
}
