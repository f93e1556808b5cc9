"""The claim measures decided on the hybrid model only (`measures.MEASURES`)."""

from __future__ import annotations

import os

import numpy as np

from experiments.claims.results import load
from experiments.claims.results import macro
from experiments.claims.results import row
from experiments.claims.results import se_change
from experiments.claims.results import SHORT
from experiments.claims.results import stage_changes


def own_domain_seeds(files):
  """Each seed's report: every RL stage's change in its own domains; per
  (stage, domain) the seeds up beyond 2 paired SE."""
  pairs = {}
  for f in files:
    for c in stage_changes(load(f), own=True):
      pairs.setdefault(f"{c['stage']} {SHORT.get(c['domain'], c['domain'])}",
                       []).append(c)
  mean = lambda cs: float(np.mean([c['change'] for c in cs]))
  text = (f'{len(files)} seeds; own-domain change, mean (seeds up beyond 2 '
          'paired SE): ' + ', '.join(
              f"{k} {mean(cs):+.3f} ({sum(c['change'] > 2 * c['se'] for c in cs)})"
              for k, cs in pairs.items()))
  return text, dict(pairs=pairs)


def hybrid_rlhf(files):
  """hybrid_rlhf/<arm>/seed<S>/rerun.json: per arm, each seed's preference
  and math change from MOPD with their paired SE."""
  arms = {}
  for f in sorted(files):
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    rerun = load(f)
    pref, math = row(rerun, 'preference'), row(rerun, 'math')
    arms.setdefault(arm, []).append(dict(
        pref=pref['change'], pref_se=pref['se'], math=math['change'],
        math_se=math['se']))
  part = lambda a, rs: (
      f"{a}: pref {np.mean([r['pref'] for r in rs]):+.3f} ("
      + ', '.join(f"{r['pref']:+.3f}" for r in rs)
      + f"; {sum(r['pref'] > 2 * r['pref_se'] for r in rs)} up beyond 2 SE)"
      f", math {np.mean([r['math'] for r in rs]):+.3f}")
  text = ('hybrid RLHF from MOPD (seed-0 hybrid cascade), change over stage '
          'seeds: ' + '; '.join(part(a, rs) for a, rs in arms.items()))
  return text, dict(arms=arms)


def sft_mix(files):
  """hybrid_sft_mix/<arm>/seed<S>/report.json (cascades of SFT alone): per
  seed, each non-default arm's SFT scores against the default arm's of the
  same seed (the same eval prompts and sampling keys), paired over prompts;
  preference's differences decide, the other domains are reported."""
  by = {}                                     # arm -> seed -> SFT scores
  for f in sorted(files):
    seed = os.path.basename(os.path.dirname(f))
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    sft = next(s for s in load(f)['stages'] if s['name'] == 'sft')
    by.setdefault(arm, {})[seed] = sft['scores']
  base = by.pop('default', {})
  parts, changes = [], []
  for arm, seeds in sorted(by.items()):
    diffs = {}                                # domain -> per-seed diffs
    for seed, scores in sorted(seeds.items()):
      if seed not in base:
        continue
      for d, b in scores.items():
        a = base[seed][d]
        diffs.setdefault(d, []).append(dict(
            change=b['pass_rate'] - a['pass_rate'], se=se_change(a, b),
            before=a['pass_rate'], after=b['pass_rate']))
    pref = diffs.pop('preference', [])
    changes = changes or pref
    ups = sum(c['change'] > 2 * c['se'] for c in pref)
    parts.append(
        f'{arm} against default, SFT preference: ' + ', '.join(
            f"{c['before']:.3f} -> {c['after']:.3f} ({c['change']:+.3f})"
            for c in pref)
        + f' ({ups} of {len(pref)} seeds up beyond 2 paired SE); other '
        'domains, mean difference (seeds down beyond 2 SE): ' + ', '.join(
            f"{SHORT.get(d, d)} {np.mean([c['change'] for c in cs]):+.3f} "
            f"({sum(c['change'] < -2 * c['se'] for c in cs)})"
            for d, cs in sorted(diffs.items())))
  return '; '.join(parts) or 'no arm beside the default', dict(
      changes=changes)


def if_hurts(files):
  """Rule 6 on the hybrid: hybrid_if_hurts/base/report.json (the cascade
  IF-RL reruns start from: its SFT), hybrid_if_hurts/if_rl/seed<S>/
  rerun.json (IF-RL's preference change from SFT per stage seed) and
  RLHF's Bradley-Terry reruns from MOPD (.../bt_kl0.1_seed<S>/rerun.json:
  their preference after RLHF, mean over seeds, against SFT's)."""
  rep = load(next(f for f in files if f.endswith('report.json')))
  sft = next(s for s in rep['stages'] if s['name'] == 'sft')
  start = sft['scores']['preference']['pass_rate']
  reruns = [row(load(f), 'preference') for f in sorted(files)
            if '/if_rl/' in f and f.endswith('rerun.json')]
  rlhf = [row(load(f), 'preference') for f in sorted(files)
          if '/bt_kl0.1_' in f and f.endswith('rerun.json')]
  drops = [r['change'] for r in reruns]
  hurt = sum(r['change'] < -2 * r['se'] for r in reruns)
  after = float(np.mean([r['after'] for r in rlhf])) if rlhf else float('nan')
  text = (f"IF-RL changes pref {', '.join(f'{d:+.3f}' for d in drops)} "
          f'({len(drops)} seeds, {hurt} beyond 2 SE) from SFT {start:.3f}; '
          f'RLHF (Bradley-Terry) from MOPD over {len(rlhf)} seeds: '
          + (f"{np.mean([r['before'] for r in rlhf]):.3f} -> {after:.3f} "
             f'(SFT {start:.3f})' if rlhf else 'none'))
  return text, dict(changes=[dict(change=r['change'], se=r['se'])
                             for r in reruns],
                    start=start, recovered=after)


def hybrid_mopd(files):
  """Rule 32: hybrid_mopd/<arm>/seed<S>/rerun.json (MOPD rerun from
  multi_domain_rl of the hybrid main job of cascade seed S) and that main
  job's report (hybrid_stage_order/default/seed<S>/report.json). Per arm
  and seed: the macro change over MOPD's own domains ('mopd') and over the
  others ('others'), each with its SE; the teachers' lead over MOPD's
  start per domain, from the reports; whether the default arm reproduces
  the main job's MOPD scores."""
  reports = {os.path.basename(os.path.dirname(f)): load(f)
             for f in files if f.endswith('report.json')}
  arms, domains, same = {}, {}, []
  for f in sorted(f for f in files if f.endswith('rerun.json')):
    seed = os.path.basename(os.path.dirname(f))
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    rows = load(f)['rows']
    own = [r for r in rows if r['own']]
    (m, m_se), (o, o_se) = macro(own), macro([r for r in rows
                                               if not r['own']])
    arms.setdefault(arm, []).append(dict(mopd=m, mopd_se=m_se, others=o,
                                         others_se=o_se))
    for r in own:
      domains.setdefault(arm, {}).setdefault(r['domain'], []).append(r)
    if arm == 'default' and seed in reports:
      main = next(s for s in reports[seed]['stages'] if s['name'] == 'mopd')
      same.append(all(abs(main['scores'][r['domain']]['pass_rate']
                          - r['after']) < 1e-9 for r in rows))
  leads = {}                                  # domain -> per-seed leads
  for rep in reports.values():
    by = {s['name']: s for s in rep['stages']}
    mopd = by['mopd']
    start = by[mopd['init_from']]
    for d, t in sorted(mopd['teachers'].items()):
      a, b = start['scores'][d], by[t]['scores'][d]
      leads.setdefault(f'{SHORT.get(d, d)} <- {t}', []).append(dict(
          change=b['pass_rate'] - a['pass_rate'], se=se_change(a, b)))
  fmt = lambda rs, x: f"{np.mean([r[x] for r in rs]):+.3f}"
  part = lambda a, rs: (
      f"{a}: MOPD's domains {fmt(rs, 'mopd')} ("
      + ', '.join(f"{r['mopd']:+.3f}" for r in rs)
      + f"; {sum(r['mopd'] > 2 * r['mopd_se'] for r in rs)} up beyond 2 SE)"
      f", others {fmt(rs, 'others')}; " + ', '.join(
          f"{SHORT.get(d, d)} {fmt(cs, 'change')}"
          for d, cs in domains[a].items()))
  text = ('hybrid MOPD from multi_domain_rl (rule 29 default arm, cascade '
          'seeds), mean change over seeds: '
          + '; '.join(part(a, rs) for a, rs in arms.items())
          + "; the teachers' lead over MOPD's start, mean (seeds beyond 2 "
          'paired SE): ' + ', '.join(
              f"{k} {fmt(cs, 'change')} "
              f"({sum(c['change'] > 2 * c['se'] for c in cs)})"
              for k, cs in leads.items())
          + (f"; the default arm equals the main job's MOPD in {sum(same)} "
             f'of {len(same)} seeds' if same else ''))
  return text, dict(arms=arms, leads=leads, reproduced=same)
