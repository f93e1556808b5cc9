"""The claims' measures: each reads a rule's result files and returns (the row's text, the numbers its verdict function takes).

A rule file names its measure by its key in `MEASURES`. Once a rule has
results, the measure it names must not change (`history.check`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from experiments.claims import hybrid_measures
from experiments.claims.results import load
from experiments.claims.results import row
from experiments.claims.results import se_change
from experiments.claims.results import SHORT
from experiments.claims.results import stage_changes

NAMES = {'bradley_terry': 'Bradley-Terry', 'generative_judge': 'judge'}


def short(c: dict) -> str:
  return f"{c['stage']} {SHORT.get(c['domain'], c['domain'])} {c['change']:+.3f}"


def main_job(files):
  rep = load(files[0])
  changes = stage_changes(rep, own=True)
  up = [c['change'] > 2 * c['se'] for c in changes]
  drops = [c for c in stage_changes(rep, own=False)
           if c['change'] < -2 * c['se']]
  meta = rep.get('meta', {})
  text = (f'{sum(up)} of {len(changes)} own-domain changes up beyond 2 '
          'paired SE: ' + ', '.join(short(c) + ('' if u else ' (**miss**)')
                                    for c, u in zip(changes, up))
          + f'; other domains down beyond 2 paired SE: {len(drops)} ('
          + ', '.join(short(c) for c in drops)
          + f") ({meta.get('wall_s', float('nan')):.0f} s, "
          f"{meta.get('machine', '?')})")
  return text, dict(changes=changes)


def math(files):
  rep = load(next(f for f in files if f.endswith('report.json')))
  sft = next(s for s in rep['stages'] if s['name'] == 'sft')['scores']['math']
  reruns = [load(f) for f in files if f.endswith('rerun.json')]
  weights = next((load(f)['results'] for f in files
                  if f.endswith('sft_math_weight.json')), {})
  rows = [row(r, 'math') for r in reruns]
  ch = [r['change'] for r in rows]
  text = (f"SFT math {sft['pass_rate']:.3f} ± {sft['pass_se']:.3f}; GRPO on "
          f"math (`math_rl`, 30 steps from SFT, {len(rows)} seeds): "
          + ', '.join(f"{r['before']:.3f} -> {r['after']:.3f} ({r['change']:+.3f}"
                      f", 2 SE {2 * r['se']:.3f})" for r in rows)
          + (f'; mean {np.mean(ch):+.3f}' if ch else '')
          + ''.join(f"; SFT at math {w}: {v['pass_at_1_t1']:.3f}"
                    for w, v in weights.items()))
  return text, dict(start=sft['pass_rate'],
                    changes=[dict(change=r['change'], se=r['se'])
                             for r in rows])


def mopd(files):
  r = load(files[0])
  ratio = r.get('ratio_mopd_to_grpo') or {}

  arm = lambda a: f'{a.upper()} ' + arm_text(r, a)
  text = (f"from `{os.path.basename(r['init_from'].rstrip('/'))}` "
          f"(math {r['start']:.3f}) to the SFT teacher's {r['teacher_score']:.3f}"
          f": {arm('mopd')}; {arm('grpo')}; MOPD / GRPO steps "
          f"{ratio.get('censored') or float('nan'):.2f} (not reached = "
          f"{r['config']['base']['steps']} steps)")
  gap = (r.get('steps_to_gap') or {}).get('90pct_gap')
  if gap:
    text += ('; steps to close 90% of the gap (a later rule, not applied): '
             'MOPD ' + ' '.join('-' if x is None else str(x)
                                for x in gap['mopd']['per_seed'])
             + ', GRPO ' + ' '.join('-' if x is None else str(x)
                                    for x in gap['grpo']['per_seed']))
  for a in r['steps_to_teacher']:
    if a not in ('grpo', 'mopd'):
      text += f'; {a}: {arm_text(r, a)}'
  st = r['steps_to_teacher']
  return text, dict(mopd=st['mopd'], grpo=st['grpo'])


def arm_text(r, a):
  s = r['steps_to_teacher'][a]
  seeds = ' '.join('-' if x is None else str(x) for x in s['per_seed'])
  return (f"reached the teacher in {s['reached']}/{s['seeds']} seeds "
          f"(steps {seeds}), end {r['end'][a]['final']:.3f}")


def judge(files):
  a = load(files[0])
  p, s = a['pairs'], a['samples']
  text = (f"agreement with the rule judge, held-out chosen/rejected pairs "
          f"(n={p['n']}): judge {p['judge']:.3f}, Bradley-Terry "
          f"{p['bradley_terry']:.3f}; pairs of SFT samples the rule judge "
          f"ranks (n={s['n']}): judge {s['judge']:.3f}, Bradley-Terry "
          f"{s['bradley_terry']:.3f} (SE <= {s['se']:.3f})")
  return text, dict(n=p['n'])


def rlhf_runs(files, reward: str | None = None, kl: str | None = None):
  """{(reward, kl): [preference rows]} of rlhf/<judge|bt>kl<K>_seed<S>."""
  by = {}
  for f in files:
    name = os.path.basename(os.path.dirname(f))
    r, k, _ = name.split('_')
    r = {'judge': 'generative_judge', 'bt': 'bradley_terry'}[r]
    if (reward is None or r == reward) and (kl is None or k[2:] == kl):
      by.setdefault((r, k[2:]), []).append(row(load(f), 'preference'))
  return by


def rlhf_reward(files):
  by = {r: rows for (r, _), rows in rlhf_runs(files, kl='0.1').items()}
  parts, means = [], {}
  for kind in ('generative_judge', 'bradley_terry'):
    rows = by.get(kind, [])
    if not rows:
      continue
    means[kind] = float(np.mean([r['change'] for r in rows]))
    n_up = sum(r['change'] > 2 * r['se'] for r in rows)
    parts.append(f"{kind}: pref {means[kind]:+.3f} (mean of {len(rows)} "
                 f"seeds; {n_up} up beyond 2 SE)")
  text = 'RLHF from MOPD, rule-judge pass@1: ' + '; '.join(parts)
  return text, dict(means=means)


def if_hurts(files):
  rep = load(next(f for f in files if f.endswith('report.json')))
  reruns = [row(load(f), 'preference') for f in files
            if '/if_rl/' in f and f.endswith('rerun.json')]
  from configs import cascade  # pylint: disable=g-import-not-at-top
  reward = cascade.RLHF_REWARD
  rlhf = rlhf_runs([f for f in files if '/rlhf/' in f],
                    reward=reward, kl='0.1').get((reward, '0.1'), [])
  by = {s['name']: s for s in rep['stages']}
  pref = lambda n: by[n]['scores']['preference']['pass_rate']
  drops = [r['change'] for r in reruns]
  hurt = sum(r['change'] < -2 * r['se'] for r in reruns)
  text = (f"IF-RL changes pref {', '.join(f'{d:+.3f}' for d in drops)} "
          f"({len(drops)} seeds, {hurt} beyond 2 SE); main job: SFT "
          f"{pref('sft'):.3f}, IF-RL {pref('if_rl'):.3f}, RLHF {pref('rlhf'):.3f}"
          + (f'; RLHF ({NAMES[reward]}) from MOPD over {len(rlhf)} seeds: '
             f"{np.mean([r['before'] for r in rlhf]):.3f} -> "
             f"{np.mean([r['after'] for r in rlhf]):.3f}" if rlhf else ''))
  return text, dict(changes=[dict(change=r['change'], se=r['se'])
                             for r in reruns],
                    start=pref('sft'), recovered=pref('rlhf'))


def if_hurts_seeds(files):
  """Per seed's main-job report: IF-RL's preference change from the stage
  it starts from (SFT) and the main line's RLHF's preference against that
  SFT's, each with its paired SE over prompts."""
  seeds = []
  for f in files:
    by = {s['name']: s for s in load(f)['stages']}
    start = by[by['if_rl']['init_from']]
    pref = lambda n: by[n]['scores']['preference']
    a = start['scores']['preference']
    seeds.append(dict(
        start=a['pass_rate'], if_rl=pref('if_rl')['pass_rate'],
        rlhf=pref('rlhf')['pass_rate'],
        hurt=dict(change=pref('if_rl')['pass_rate'] - a['pass_rate'],
                  se=se_change(a, pref('if_rl'))),
        recovered=dict(change=pref('rlhf')['pass_rate'] - a['pass_rate'],
                       se=se_change(a, pref('rlhf')))))
  beyond = lambda k, sign: sum(sign * s[k]['change'] > 2 * s[k]['se']
                               for s in seeds)
  text = (f'{len(seeds)} seeds of the main job, preference pass@1 SFT -> '
          'IF-RL / RLHF: ' + ', '.join(
              f"{s['start']:.3f} -> {s['if_rl']:.3f} / {s['rlhf']:.3f}"
              for s in seeds)
          + f"; IF-RL down beyond 2 paired SE in {beyond('hurt', -1)}, "
          f"RLHF above SFT beyond 2 paired SE in {beyond('recovered', 1)}")
  return text, dict(seeds=seeds)


def kl(files):
  by = rlhf_runs(files)
  parts, means = [], {}
  for reward in ('bradley_terry', 'generative_judge'):
    for kl in sorted({k for r, k in by if r == reward}, key=float):
      changes = [r['change'] for r in by[(reward, kl)]]
      means[(reward, kl)] = float(np.mean(changes))
      seeds = ', '.join(f'{c:+.3f}' for c in changes)
      parts.append(f'{NAMES[reward]} KL {kl}: pref {np.mean(changes):+.3f} '
                   f'({seeds})')
  text = 'RLHF from MOPD, 15 steps: ' + '; '.join(parts)
  from configs import cascade  # pylint: disable=g-import-not-at-top
  default = {k: v for (r, k), v in means.items() if r == cascade.RLHF_REWARD}
  return (text + f' (decided on the default reward, '
          f'{NAMES[cascade.RLHF_REWARD]})', dict(means=default))


def forgetting(files):
  """Per seed's main-job report: each RL stage's changes in the other
  domains, and the final stage against SFT per domain."""
  reps = [load(f) for f in files]
  stage_drops, final = {}, {}
  for rep in reps:
    for c in stage_changes(rep, own=False):
      stage_drops.setdefault(f"{c['stage']} {c['domain']}", []).append(c)
    chain = [s for s in rep['stages']
             if s.get('scores') and not s.get('branch')]
    sft, last = chain[0], chain[-1]
    for d in sorted(last['scores']):
      a, b = sft['scores'][d], last['scores'][d]
      final.setdefault(d, []).append(dict(
          change=b['pass_rate'] - a['pass_rate'], se=se_change(a, b)))
  mean = lambda cs: float(np.mean([c['change'] for c in cs]))
  beyond = lambda cs: sum(c['change'] < -2 * c['se'] for c in cs)
  worst = sorted(stage_drops.items(), key=lambda kv: mean(kv[1]))[:4]
  text = (f'{len(reps)} seeds of the main job; largest mean drops in '
          'another domain (seeds down beyond 2 paired SE): '
          + ', '.join(f'{k} {mean(cs):+.3f} ({beyond(cs)})' for k, cs in worst)
          + '; final stage against SFT: '
          + ', '.join(f'{SHORT.get(d, d)} {mean(cs):+.3f} ({beyond(cs)})'
                      for d, cs in final.items()))
  return text, dict(seeds=len(reps), stage_drops=stage_drops,
                    final_vs_sft=final)


def if_rl_reward(files):
  """IF-RL reruns, the paper's reward ('passed' arm) beside the graded one:
  the instruction-following change per seed (own domain)."""
  arms = {}
  for f in files:
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    arms.setdefault(arm, []).append(row(load(f), 'instruction_following'))
  parts = []
  for arm, rows in sorted(arms.items()):
    changes = ', '.join(f"{r['change']:+.3f}" for r in rows)
    ups = sum(r['change'] > 2 * r['se'] for r in rows)
    parts.append(f'{arm}: IF {changes} ({len(rows)} seeds, {ups} up beyond '
                 '2 paired SE)')
  text = '; '.join(parts)
  return text, dict(changes=[dict(change=r['change'], se=r['se'])
                             for r in arms.get('if_rl_passed', [])])


def recovery(files):
  """MOPD (best earlier teachers) and GRPO from the damaging stage, per
  seed (files .../seedS/{mopd,grpo}/rerun.json): each damaged domain's
  change, the share of its gap to the teacher MOPD closed, and MOPD's worst
  change elsewhere."""
  runs = {}                                    # arm -> seed -> rerun.json
  for f in files:
    arm = os.path.basename(os.path.dirname(f))
    seed = os.path.basename(os.path.dirname(os.path.dirname(f)))
    runs.setdefault(arm, {})[seed] = load(f)
  mopd = [doc for _, doc in sorted(runs.get('mopd', {}).items())]
  grpo = [doc for _, doc in sorted(runs.get('grpo', {}).items())]
  doms = sorted({d for doc in mopd for d in doc['recover']['teachers']})
  mean = lambda xs: float(np.mean(xs)) if xs else float('nan')
  ups = lambda rows: sum(r['change'] > 2 * r['se'] for r in rows)
  out, parts = {}, []
  for d in doms:
    out[d] = dict(mopd=[row(doc, d) for doc in mopd],
                  grpo=[row(doc, d) for doc in grpo])
    closed = []
    for doc, r in zip(mopd, out[d]['mopd']):
      gap = doc['recover']['teachers'][d]['score'] - r['before']
      if gap > 0:
        closed.append(r['change'] / gap)
    m, g = out[d]['mopd'], out[d]['grpo']
    parts.append(
        f"{SHORT.get(d, d)}: MOPD {mean([r['change'] for r in m]):+.3f} "
        f'({ups(m)} of {len(m)} seeds up beyond 2 paired SE; '
        f'{mean(closed):.0%} of the gap to its teacher closed), GRPO '
        f"{mean([r['change'] for r in g]):+.3f} ({ups(g)} of {len(g)})")
  others = {}
  for doc in mopd:
    for r in doc['rows']:
      if r['domain'] not in doms:
        others.setdefault(r['domain'], []).append(r['change'])
  if others:
    worst = min(others, key=lambda d: mean(others[d]))
    parts.append(f'MOPD elsewhere, worst: {SHORT.get(worst, worst)} '
                 f'{mean(others[worst]):+.3f}')
  teachers = sorted({f"{SHORT.get(d, d)} <- {t['stage']}" for doc in mopd
                     for d, t in doc['recover']['teachers'].items()})
  after = mopd[0]['recover']['after'] if mopd else '?'
  text = (f"from {after}, 12 steps of 16 x 4 rollouts; teachers "
          f"{', '.join(teachers)}; " + '; '.join(parts))
  return text, dict(domains=out)


def lc_mix(files):
  """A stage run two ways from the same checkpoint (files
  .../ARM/seedS/rerun.json): every domain's change per arm, mean over
  seeds. Two arms: the baseline ('alone' or 'default') and the remedy (the
  other; long-context RL 'mixed' with other domains' data, or at another
  learning rate)."""
  runs = {}                                    # arm -> seed -> rerun.json
  for f in files:
    arm = os.path.basename(os.path.dirname(os.path.dirname(f)))
    runs.setdefault(arm, {})[os.path.basename(os.path.dirname(f))] = load(f)
  base = next((a for a in ('alone', 'default') if a in runs), 'alone')
  other = next((a for a in sorted(runs) if a != base), 'mixed')
  rows = {arm: [{r['domain']: r for r in doc['rows']}
                for _, doc in sorted(seeds.items())]
          for arm, seeds in runs.items()}
  doms = sorted({d for arm in rows.values() for seed in arm for d in seed})
  mean = lambda xs: float(np.mean(xs)) if xs else float('nan')
  out = {d: {arm: [seed[d] for seed in rows.get(arm, [])]
             for arm in (base, other)} for d in doms}
  parts = []
  for d in doms:
    a, m = out[d][base], out[d][other]
    above = sum(x['change'] > y['change'] for x, y in zip(m, a))
    parts.append(f"{SHORT.get(d, d)} {mean([r['change'] for r in a]):+.3f} "
                 f"{base} / {mean([r['change'] for r in m]):+.3f} {other} "
                 f'({other} above in {above} of {min(len(a), len(m))})')
  text = ('from rlhf, 30 steps, mean change over seeds: ' + ', '.join(parts))
  return text, dict(domains=out, own=out.get('long_context', {}))


def stage_order(files, same_sft=True, label='default order'):
  """The stage orders (files .../stage_order/ARM/seedS/report.json): per
  seed, the default order's last stage against each other order's, the
  macro mean over domains and per domain, paired over prompts; void if an
  arm's SFT differs from the default's (unless not `same_sft`: settings
  that change the SFT, `settings`)."""
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
      if same_sft and any(sft[a][d].get('prompt_pass') != s['prompt_pass']
                          for d, s in sft['default'].items()):
        void.append(f'{seed}: {a} starts from another SFT')
      if any(sft[a][d].get('prompt_pass', {}).keys() != s.get(
          'prompt_pass', {}).keys() for d, s in sft['default'].items()):
        void.append(f'{seed}: {a} is scored on other prompts')
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
  text = (f'last stage, macro mean over domains, {label} minus '
          + '; '.join(parts) + '; mean macro pass@1: '
          + ', '.join(f'{a} {np.mean(v):.3f}' for a, v in sorted(macro.items()))
          + (f" (void: {'; '.join(void)})" if void else ''))
  return text, dict(diffs=diffs, macro=macro, per_domain=per_domain,
                    void='; '.join(void))


def settings(files):
  """Settings against the default (files .../ARM/seedS/report.json, the
  default's in a folder named default): `stage_order`'s figures, each arm
  from its own SFT."""
  return stage_order(files, same_sft=False, label='the default')


def kl_main(files):
  """The main job at KL 0.03 (.../rlhf_kl_main/report.json for seed 0,
  .../rlhf_kl_main/seedS/report.json; the hybrid's in hybrid_rlhf_kl_main/)
  against the 0.1 jobs of the same seeds (any other file: rule 13's
  forgetting sweep, .../forgetting/seedS/report.json; rule 30's, rule 29's
  default arm): rules 13 and 30's (a) and (b) per seed."""
  arms = {}                                  # kl -> seed -> stages by name
  for f in files:
    parent = os.path.basename(os.path.dirname(f))
    kl = '0.03' if 'rlhf_kl_main/' in f else '0.1'
    seed = int(parent[4:]) if parent.startswith('seed') else 0
    arms.setdefault(kl, {})[seed] = {s['name']: s for s in load(f)['stages']}
  seeds, void, parts = [], [], []
  for seed in sorted(set(arms.get('0.03', {})) & set(arms.get('0.1', {}))):
    old, new = arms['0.1'][seed], arms['0.03'][seed]
    if any(old[s]['scores'][d]['prompt_pass'] != new[s]['scores'][d][
        'prompt_pass'] for s in ('sft', 'if_rl', 'multi_domain_rl')
           for d in old[s]['scores']):
      void.append(f'seed {seed}: the runs differ before RLHF')
    a_old, a_new = (x['rlhf']['scores']['preference'] for x in (old, new))
    pref = a_new['pass_rate'] - a_old['pass_rate']
    lower = []
    for d, y in sorted(new['swe_agent_rl']['scores'].items()):
      x = old['swe_agent_rl']['scores'][d]
      if y['pass_rate'] - x['pass_rate'] < -2 * se_change(x, y):
        lower.append(f"{SHORT.get(d, d)} {y['pass_rate'] - x['pass_rate']:+.3f}")
    seeds.append(dict(a=pref >= 0, b=not lower))
    parts.append(f'seed {seed}: pref after rlhf {pref:+.3f} '
                 f'(2 SE {2 * se_change(a_old, a_new):.3f}), last stage lower '
                 f"beyond 2 SE: {', '.join(lower) or 'none'}")
  text = ('main job, KL 0.03 against 0.1: ' + '; '.join(parts)
          + (f" (void: {'; '.join(void)})" if void else ''))
  return text, dict(seeds=seeds, void='; '.join(void))


def mopd_gap(files):
  """experiments.mopd_vs_grpo results (one or more files, seeds merged):
  per seed, MOPD - GRPO at each evaluation after step 0 and their mean;
  the teacher's lead over the start and over GRPO's end in evaluation SE."""
  runs = {}
  for f in files:
    runs.update(load(f)['runs'])
  per_seed, per_step, gap, lead = [], {}, [], []
  for _, r in sorted(runs.items(), key=lambda kv: int(kv[0])):
    m, g = r['mopd'], r['grpo']
    assert m['steps'] == g['steps'], 'the arms were evaluated apart'
    diffs = [a - b for a, b in zip(m['scores'][1:], g['scores'][1:])]
    per_seed.append(float(np.mean(diffs)))
    for step, x in zip(m['steps'][1:], diffs):
      per_step.setdefault(step, []).append(x)
    se0 = float(np.mean([m['ses'][0], g['ses'][0]]))
    gap.append((r['teacher']['score'] - g['scores'][0]) / se0)
    lead.append((r['teacher']['score'] - g['scores'][-1])
                / float(np.hypot(r['teacher']['se'], g['ses'][-1])))
  n = len(per_seed)
  mean = float(np.mean(per_seed)) if n else float('nan')
  se = float(np.std(per_seed, ddof=1) / np.sqrt(n)) if n > 1 else float('nan')
  steps = sorted(per_step)
  text = (f'{n} seeds; MOPD - GRPO, mean over the evaluations of each seed: '
          + ', '.join(f'{x:+.3f}' for x in per_seed)
          + f'; mean {mean:+.3f} (SE {se:.3f}); by step: '
          + ', '.join(f'{s} {np.mean(per_step[s]):+.3f}' for s in steps)
          + f'; teacher above the start by {np.mean(gap):.1f} SE, above '
          f"GRPO's end by {np.mean(lead):.1f} SE")
  return text, dict(per_seed=per_seed, mean=mean, se=se,
                    gap_se=float(np.mean(gap)) if gap else 0.0,
                    lead_se=float(np.mean(lead)) if lead else 0.0,
                    per_step={s: per_step[s] for s in steps})


MEASURES: dict[str, Callable[[list[str]], tuple[str, dict]]] = dict(
    main_job=main_job, math=math, mopd=mopd, judge=judge,
    rlhf_reward=rlhf_reward, if_hurts=if_hurts,
    if_hurts_seeds=if_hurts_seeds, kl=kl,
    forgetting=forgetting, if_rl_reward=if_rl_reward, recovery=recovery,
    lc_mix=lc_mix, stage_order=stage_order,
    kl_main=kl_main, mopd_gap=mopd_gap, settings=settings,
    own_domain_seeds=hybrid_measures.own_domain_seeds,
    hybrid_rlhf=hybrid_measures.hybrid_rlhf,
    sft_mix=hybrid_measures.sft_mix,
    if_hurts_hybrid=hybrid_measures.if_hurts,
    hybrid_mopd=hybrid_measures.hybrid_mopd)
