"""The verdict functions a claim's rule names: each applies the rule to the numbers a measure read from the result files.

Each takes the rule (the "rule" object of a rule file) and the numbers, and
returns the verdict's words. A rule names its function by the part after
`verdict_` (`VERDICTS`). Once a rule has results, the function it names
must not change (`history.check`): a new decision procedure is a new
function and a new rule.
"""

from __future__ import annotations

from collections.abc import Callable


def verdict_all_up(rule: dict, m: dict) -> str:
  """Every change up beyond threshold x its SE: 'holds'; else 'k/n'."""
  ups = [c['change'] > rule['threshold'] * c['se'] for c in m['changes']]
  return 'holds' if all(ups) else f'{sum(ups)}/{len(ups)}'


def verdict_band_then_up(rule: dict, m: dict) -> str:
  """The start inside rule['band'] and every seed's change up beyond the
  threshold: 'holds'; one of the two: 'partly'; neither: 'no'."""
  lo, hi = rule['band']
  in_band = lo <= m['start'] <= hi
  ups = [c['change'] > rule['threshold'] * c['se'] for c in m['changes']]
  if len(ups) < rule['seeds']:
    return f"open ({len(ups)} of {rule['seeds']} seeds)"
  if in_band and all(ups):
    return 'holds'
  return 'partly' if in_band or any(ups) else 'no'


def verdict_fewer_steps_to_teacher(rule: dict, m: dict) -> str:
  """MOPD 'faster': it reached the teacher's score in more seeds, or in as
  many (at least one) with fewer mean steps (the rule of e7a9e0d)."""
  del rule
  a, b = m['mopd'], m['grpo']
  faster = (a['reached'] > b['reached'] or
            (a['reached'] == b['reached'] and a['reached'] > 0 and
             a['mean'] < b['mean']))
  return 'holds' if faster else 'no'


def verdict_up_in_seeds(rule: dict, m: dict) -> str:
  """The change up beyond threshold x its SE in at least rule['in_seeds']
  of the seeds: 'holds'; in some: 'partly'; in none: 'no'."""
  changes = m['changes']
  if len(changes) < rule['seeds']:
    return f"open ({len(changes)} of {rule['seeds']} seeds)"
  ups = sum(c['change'] > rule['threshold'] * c['se'] for c in changes)
  if ups >= rule['in_seeds']:
    return 'holds'
  return f'partly ({ups} of {len(changes)} seeds)' if ups else 'no'


def verdict_reported(rule: dict, m: dict) -> str:
  """A capability the row reports without deciding a comparison: 'built'
  when the measurement exists, else 'open'. It cannot come out negative:
  the tables show its rows as measurements, not verdicts (`MEASUREMENTS`)."""
  del rule
  return 'built' if m.get('n', 0) > 0 else 'open'


def verdict_mean_ahead(rule: dict, m: dict) -> str:
  """Arm rule['arm'] ahead of rule['other'] in mean change over seeds."""
  a, b = m['means'].get(rule['arm']), m['means'].get(rule['other'])
  if a is None or b is None:
    return 'open'
  return (f"holds: {rule['arm']} ahead" if a >= b else
          f"no: {rule['other']} ahead")


def verdict_hurts_then_recovers(rule: dict, m: dict) -> str:
  """Some seed's change down beyond the threshold (hurts) and the recovery
  stage above the start ('recovers')."""
  hurt = any(c['change'] < -rule['threshold'] * c['se'] for c in m['changes'])
  recovered = m['recovered'] > m['start']
  if hurt and recovered:
    return 'holds'
  return 'RLHF recovers; IF-RL does not hurt here' if recovered else 'no'


def verdict_hurts_then_recovers_in_seeds(rule: dict, m: dict) -> str:
  """Per seed (m['seeds']: each with 'hurt' and 'recovered', a change and
  its SE): 'holds' if the hurt is down beyond threshold x SE and the
  recovery up beyond it, each in rule['in_seeds'] or more seeds; 'partly'
  naming the part that holds; else 'no'."""
  seeds, k, t = m['seeds'], rule['in_seeds'], rule['threshold']
  if len(seeds) < rule['seeds']:
    return f"open ({len(seeds)} of {rule['seeds']} seeds)"
  hurt = sum(s['hurt']['change'] < -t * s['hurt']['se'] for s in seeds) >= k
  back = sum(s['recovered']['change'] > t * s['recovered']['se']
             for s in seeds) >= k
  if hurt and back:
    return 'holds'
  if hurt or back:
    return ('partly: ' + ('IF-RL hurts; RLHF not above SFT' if hurt else
                          'RLHF above SFT; IF-RL does not hurt')
            + f' in {k} of {len(seeds)} seeds')
  return 'no'


def verdict_best_mean(rule: dict, m: dict) -> str:
  """The setting with the best mean change (of at least two measured)."""
  means = m['means']
  if len(means) < 2:
    return 'open (one setting measured)'
  best = max(means, key=means.get)
  return f"{rule.get('name', 'setting')} {best} better here"


def verdict_forgets_little(rule: dict, m: dict) -> str:
  """The cascade 'forgets little': over the seeds, no domain ends below SFT
  beyond the threshold in `rule['in_seeds']` or more seeds (else 'no'), and
  no stage drops the same other domain beyond it in that many seeds (else
  'partly')."""
  seeds, need = m['seeds'], rule['seeds']
  if seeds < need:
    return f'open ({seeds} of {need} seeds)'
  k, t = rule['in_seeds'], rule['threshold']
  final = {d: sum(c['change'] < -t * c['se'] for c in cs)
           for d, cs in m['final_vs_sft'].items()}
  stages = {key: sum(c['change'] < -t * c['se'] for c in cs)
            for key, cs in m['stage_drops'].items()}
  lost = sorted(d for d, n in final.items() if n >= k)
  if lost:
    return 'no: below SFT at the end in ' + ', '.join(lost)
  forgot = sorted(key for key, n in stages.items() if n >= k)
  if forgot:
    return 'partly: ' + ', '.join(forgot) + ' dropped, recovered by the end'
  return 'holds'


def verdict_recovers(rule: dict, m: dict) -> str:
  """MOPD recovers the damaged domains: in every one of rule['domains'] its
  change up beyond threshold x the paired SE in rule['in_seeds'] or more
  seeds and its mean change at least GRPO's ('holds'); up that far in some
  domain ('partly: ...'); else 'no'."""
  k, t = rule['in_seeds'], rule['threshold']
  arms = m['domains']
  seeds = min((len(a.get(arm, [])) for a in arms.values()
               for arm in ('mopd', 'grpo')), default=0)
  if seeds < rule['seeds']:
    return f"open ({seeds} of {rule['seeds']} seeds)"
  mean = lambda cs: sum(c['change'] for c in cs) / len(cs)
  up = [d for d in rule['domains']
        if sum(c['change'] > t * c['se'] for c in arms[d]['mopd']) >= k]
  ahead = [d for d in rule['domains']
           if mean(arms[d]['mopd']) >= mean(arms[d]['grpo'])]
  if set(up) == set(ahead) == set(rule['domains']):
    return 'holds'
  if up:
    behind = [d for d in rule['domains'] if d not in ahead]
    return ('partly: MOPD recovers ' + ', '.join(up)
            + (f"; GRPO ahead in {', '.join(behind)}" if behind else ''))
  return 'no'


def verdict_mixing_forgets_less(rule: dict, m: dict) -> str:
  """The remedy arm (rule['arms'][1]; default 'mixed') above the baseline
  arm (rule['arms'][0]; 'alone') in every seed in each of
  rule['domains'], and its own domain (rule['own']) up beyond threshold x
  the paired SE in rule['in_seeds'] seeds: 'holds'; above in some domain,
  or in all without the own lift: 'partly'; else 'no'."""
  base, remedy = rule.get('arms', ('alone', 'mixed'))
  arms = m['domains']
  seeds = min((len(arms[d].get(a, [])) for d in rule['domains']
               for a in (base, remedy)), default=0)
  if seeds < rule['seeds']:
    return f"open ({seeds} of {rule['seeds']} seeds)"
  above = [d for d in rule['domains'] if all(
      x['change'] > y['change']
      for x, y in zip(arms[d][remedy], arms[d][base], strict=True))]
  lifted = sum(c['change'] > rule['threshold'] * c['se']
               for c in m['own'][remedy]) >= rule['in_seeds']
  if lifted and set(above) == set(rule['domains']):
    return 'holds'
  if above:
    return ('partly: ' + ', '.join(above) + ' kept'
            + ('' if lifted else f", {rule['own']} not lifted"))
  return 'no'


def verdict_order_ahead(rule: dict, m: dict) -> str:
  """The default order against each other one (m['diffs'][arm]: per seed,
  the default's macro mean minus the arm's, with its paired SE): ahead
  beyond threshold x SE in rule['in_seeds'] or more seeds against every
  arm: 'holds'; some arm ahead of the default that far: 'no'; ahead of
  some arm: 'partly'; else 'not shown at this scale'. 'void' when the
  arms did not start from the same SFT."""
  if m.get('void'):
    return f"void ({m['void']})"
  diffs, k, t = m['diffs'], rule['in_seeds'], rule['threshold']
  others = [a for a in rule['arms'] if a != rule['default']]
  seeds = min((len(diffs.get(a, [])) for a in others), default=0)
  if seeds < rule['seeds']:
    return f"open ({seeds} of {rule['seeds']} seeds)"
  ahead = [a for a in others if sum(d['diff'] > t * d['se']
                                    for d in diffs[a]) >= k]
  behind = [a for a in others if sum(d['diff'] < -t * d['se']
                                     for d in diffs[a]) >= k]
  if behind:
    return 'no: ' + ', '.join(behind) + ' ahead of the default'
  if len(ahead) == len(others):
    return 'holds'
  if ahead:
    return 'partly: ahead of ' + ', '.join(ahead)
  return 'not shown at this scale'


def verdict_adopt_if_ahead(rule: dict, m: dict) -> str:
  """A setting against the default (m['diffs'][arm]: per seed, the
  default's macro mean minus the arm's, with its paired SE;
  m['per_domain'][arm][domain]: the same per domain): the arm is adopted if
  it is ahead beyond threshold x SE in rule['in_seeds'] or more seeds and
  no domain ends lower in it that far in as many seeds; the default stays
  otherwise ('no' if the default is ahead that far)."""
  if m.get('void'):
    return f"void ({m['void']})"
  k, t = rule['in_seeds'], rule['threshold']
  arm = next(a for a in rule['arms'] if a != rule['default'])
  diffs = m['diffs'].get(arm, [])
  if len(diffs) < rule['seeds']:
    return f"open ({len(diffs)} of {rule['seeds']} seeds)"
  ahead = sum(d['diff'] < -t * d['se'] for d in diffs)
  behind = sum(d['diff'] > t * d['se'] for d in diffs)
  lower = sorted(dom for dom, xs in m['per_domain'].get(arm, {}).items()
                 if sum(x['diff'] > t * x['se'] for x in xs) >= k)
  if behind >= k:
    return f'no: the default ahead in {behind} of {len(diffs)} seeds'
  if ahead >= k and not lower:
    return f'{arm} adopted (ahead in {ahead} of {len(diffs)} seeds)'
  if ahead >= k:
    return (f"not adopted: {arm} ahead in {ahead} of {len(diffs)} seeds "
            f"but lower in {', '.join(lower)}")
  return 'not shown at this scale (the default stays)'


def verdict_both_parts_in_seeds(rule: dict, m: dict) -> str:
  """The main job at KL 0.03 against 0.1 (m['seeds']: per seed, whether
  (a) and (b) of the rule held, or m['void']): the default becomes 0.03 if
  both held in rule['in_seeds'] or more seeds, else it stays 0.1."""
  if m.get('void'):
    return f"void ({m['void']})"
  seeds = m['seeds']
  if len(seeds) < rule['seeds']:
    return f"open ({len(seeds)} of {rule['seeds']} seeds)"
  both = sum(s['a'] and s['b'] for s in seeds)
  return ('0.03 becomes the default' if both >= rule['in_seeds'] else
          f'0.1 stays (both parts in {both} of {len(seeds)} seeds)')


def verdict_paired_ahead(rule: dict, m: dict) -> str:
  """MOPD against GRPO at a real gap (m: 'gap_se', the teacher's lead over
  the start in evaluation SE; 'per_seed', MOPD - GRPO averaged over the
  evaluations of each seed): void below rule['min_gap_se']; holds when the
  mean over seeds is above threshold x its SE over seeds, no below minus
  that, else not shown at this scale."""
  per_seed = m['per_seed']
  if len(per_seed) < rule['seeds']:
    return f"open ({len(per_seed)} of {rule['seeds']} seeds)"
  if m['gap_se'] < rule['min_gap_se']:
    return (f"void (the teacher {m['gap_se']:.1f} SE above the start, "
            f"want {rule['min_gap_se']:g})")
  n = len(per_seed)
  mean = sum(per_seed) / n
  se = (sum((x - mean) ** 2 for x in per_seed) / (n - 1) / n) ** 0.5
  t = rule['threshold']
  if mean > t * se:
    return 'holds'
  if mean < -t * se:
    return 'no: GRPO ahead'
  return 'not shown at this scale'


def verdict_own_up_in_seeds(rule: dict, m: dict) -> str:
  """Every (stage, own domain) of m['pairs'] (per seed: change and SE) up
  beyond threshold x SE in rule['in_seeds'] or more seeds: 'holds'; else
  'k/n' and the misses."""
  pairs, k, t = m['pairs'], rule['in_seeds'], rule['threshold']
  seeds = min((len(cs) for cs in pairs.values()), default=0)
  if seeds < rule['seeds']:
    return f"open ({seeds} of {rule['seeds']} seeds)"
  up = {key: sum(c['change'] > t * c['se'] for c in cs) >= k
        for key, cs in pairs.items()}
  if all(up.values()):
    return 'holds'
  return (f'{sum(up.values())}/{len(up)} (misses: '
          + ', '.join(key for key, u in up.items() if not u) + ')')


def verdict_setting_chosen(rule: dict, m: dict) -> str:
  """A stage's setting chosen among arms (m['arms']: per arm, per seed the
  deciding change and its SE, and the guarded change and its SE: the keys
  rule['decide'] and rule['guard'], 'pref' and 'math' unless named). An arm
  other than rule['default'] qualifies if its deciding change is up beyond
  threshold x SE in rule['in_seeds'] or more seeds, its mean above the
  default's, and its mean guarded change not below the default's by more
  than threshold x its mean guarded SE; the qualifying arm with the
  highest mean deciding change is chosen. Else the default stays: 'holds
  at the default' if it is up that far in in_seeds or more seeds, else
  rule['otherwise']."""
  arms, t, k = m['arms'], rule['threshold'], rule['in_seeds']
  key, guard = rule.get('decide', 'pref'), rule.get('guard', 'math')
  want = rule.get('arms') or sorted(arms)
  done = {a: len(arms.get(a, [])) for a in want}
  if min(done.values(), default=0) < rule['seeds']:
    return 'open (' + ', '.join(f'{a} {n} of {rule["seeds"]}'
                                for a, n in done.items()) + ' seeds)'
  mean = lambda a, x: sum(r[x] for r in arms[a]) / len(arms[a])
  ups = lambda a: sum(r[key] > t * r[f'{key}_se'] for r in arms[a])
  base = rule['default']
  ok = [a for a in want if a != base and ups(a) >= k
        and mean(a, key) > mean(base, key)
        and mean(a, guard) >= mean(base, guard) - t * mean(a, f'{guard}_se')]
  if ok:
    return f"{max(ok, key=lambda a: mean(a, key))} becomes the setting"
  if ups(base) >= k:
    return 'holds at the default'
  return rule.get('otherwise',
                  'not made to work by lr, KL or steps at this scale')


VERDICTS: dict[str, Callable[[dict, dict], str]] = {
    name.removeprefix('verdict_'): fn for name, fn in globals().items()
    if name.startswith('verdict_') and callable(fn)}

# Verdict functions that cannot come out negative: what they return is a
# measurement's state, not a decision, and the tables say so.
MEASUREMENTS = frozenset({'reported'})
