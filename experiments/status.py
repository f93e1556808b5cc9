"""The README's status section, written from the raw results in docs/results/ (never by hand).

  python -m experiments.status            # print the section
  python -m experiments.status --write    # put it into README.md
  python -m experiments.status --check    # exit 1 if README.md differs

Each row is one of the paper's claims, what the committed results show at
CPU scale (numbers read from the JSON files, verdicts computed from them:
a change counts when it is beyond two paired standard errors), the files
and the command that reproduces them. tests/test_experiments.py runs
--check, so a README number without its file fails the suite.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import sys
from collections.abc import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = 'docs/results/claims_2026-12-02'
BEGIN = '<!-- status:begin (python -m experiments.status --write) -->'
END = '<!-- status:end -->'
NAMES = {'bradley_terry': 'Bradley-Terry', 'generative_judge': 'judge'}
SHORT = {'instruction_following': 'IF', 'multi_domain': 'multi',
         'long_context': 'long', 'preference': 'pref'}


def _load(rel: str) -> dict:
  with open(os.path.join(ROOT, rel)) as f:
    return json.load(f)


def _glob(pattern: str) -> list[str]:
  return sorted(os.path.relpath(p, ROOT)
                for p in glob.glob(os.path.join(ROOT, pattern)))


def _se_change(a: dict, b: dict) -> float:
  """Paired standard error of b - a over the prompts both scored."""
  pa, pb = a.get('prompt_pass') or {}, b.get('prompt_pass') or {}
  keys = sorted(set(pa) & set(pb))
  if len(keys) > 1:
    d = np.asarray([pb[k] - pa[k] for k in keys], np.float64)
    return float(d.std(ddof=1) / np.sqrt(len(d)))
  return float(np.hypot(a.get('pass_se', np.nan), b.get('pass_se', np.nan)))


def _sig(change: float, se: float) -> str:
  return 'beyond' if abs(change) > 2 * se else 'within'


def _row(rerun: dict, domain: str) -> dict:
  return next(r for r in rerun['rows'] if r['domain'] == domain)


@dataclasses.dataclass
class Claim:
  paper: str
  files: str                       # a path or glob under the repository
  command: str
  measure: Callable[[list[str]], tuple[str, str]]   # files -> (text, verdict)


# --------------------------------------------------------------- claims

def _main_job(files):
  rep = _load(files[0])
  by = {s['name']: s for s in rep['stages']}
  parts, lifted, n = [], 0, 0
  for s in rep['stages']:
    if s['kind'] not in ('grpo', 'mopd') or not s.get('scores'):
      continue
    start = by[s['init_from']]
    for d in s['domains']:
      a, b = start['scores'][d], s['scores'][d]
      ch, se = b['pass_rate'] - a['pass_rate'], _se_change(a, b)
      n += 1
      lifted += ch > 2 * se
      parts.append(f"{s['name']} {SHORT.get(d, d)} {ch:+.3f}")
  meta = rep.get('meta', {})
  text = (f'{lifted} of {n} own-domain changes up beyond 2 paired SE: '
          + ', '.join(parts) + f" ({meta.get('wall_s', float('nan')):.0f} s, "
          f"{meta.get('machine', '?')})")
  return text, 'holds' if lifted == n else f'{lifted}/{n}'


def _math(files):
  rep = _load(next(f for f in files if f.endswith('report.json')))
  sft = next(s for s in rep['stages'] if s['name'] == 'sft')['scores']['math']
  reruns = [_load(f) for f in files if f.endswith('rerun.json')]
  weights = next((_load(f)['results'] for f in files
                  if f.endswith('sft_math_weight.json')), {})
  rows = [_row(r, 'math') for r in reruns]
  ch = [r['change'] for r in rows]
  beyond = sum(abs(r['change']) > 2 * r['se'] and r['change'] > 0
               for r in rows)
  in_band = 0.3 <= sft['pass_rate'] <= 0.6
  text = (f"SFT math {sft['pass_rate']:.3f} ± {sft['pass_se']:.3f}; GRPO on "
          f"math (`math_rl`, 30 steps from SFT, {len(rows)} seeds): "
          + ', '.join(f"{r['before']:.3f} -> {r['after']:.3f} ({r['change']:+.3f}"
                      f", 2 SE {2 * r['se']:.3f})" for r in rows)
          + (f'; mean {np.mean(ch):+.3f}' if ch else '')
          + ''.join(f"; SFT at math {w}: {v['pass_at_1_t1']:.3f}"
                    for w, v in weights.items()))
  ok = in_band and rows and beyond == len(rows)
  return text, 'holds' if ok else 'partly' if beyond or in_band else 'no'


def _mopd(files):
  r = _load(files[0])
  ratio = r.get('ratio_mopd_to_grpo') or {}

  arm = lambda a: f'{a.upper()} ' + arm_text(r, a)
  text = (f"from `{os.path.basename(r['init_from'].rstrip('/'))}` "
          f"(math {r['start']:.3f}) to the SFT teacher's {r['teacher_score']:.3f}"
          f": {arm('mopd')}; {arm('grpo')}; MOPD / GRPO steps "
          f"{ratio.get('censored') or float('nan'):.2f} (not reached = "
          f"{r['config']['base']['steps']} steps)")
  gap = (r.get('steps_to_gap') or {}).get('90pct_gap')
  if gap:
    text += ("; steps to close 90% of the gap: MOPD "
             + ' '.join('-' if x is None else str(x)
                        for x in gap['mopd']['per_seed'])
             + ', GRPO ' + ' '.join('-' if x is None else str(x)
                                    for x in gap['grpo']['per_seed'])
             + f" (ratio of means {ratio.get('90pct_gap') or float('nan'):.2f})")
  for arm in r['steps_to_teacher']:
    if arm not in ('grpo', 'mopd'):
      text += f"; {arm}: {arm_text(r, arm)}"
  faster = gap is not None and (ratio.get('90pct_gap') or 9) < 1
  if not faster:
    return text, 'no'
  if r['end']['grpo']['final'] > r['end']['mopd']['final']:
    return text, 'partly: MOPD faster to 90% of the gap; GRPO passes the teacher'
  return text, 'holds'


def arm_text(r, a):
  s = r['steps_to_teacher'][a]
  seeds = ' '.join('-' if x is None else str(x) for x in s['per_seed'])
  return (f"reached the teacher in {s['reached']}/{s['seeds']} seeds "
          f"(steps {seeds}), end {r['end'][a]['final']:.3f}")


def _judge(files):
  a = _load(files[0])
  p, s = a['pairs'], a['samples']
  text = (f"agreement with the rule judge, held-out chosen/rejected pairs "
          f"(n={p['n']}): judge {p['judge']:.3f}, Bradley-Terry "
          f"{p['bradley_terry']:.3f}; pairs of SFT samples the rule judge "
          f"ranks (n={s['n']}): judge {s['judge']:.3f}, Bradley-Terry "
          f"{s['bradley_terry']:.3f} (SE <= {s['se']:.3f})")
  return text, 'built'


def _rlhf_runs(files, reward: str | None = None, kl: str | None = None):
  """{(reward, kl): [preference rows]} of rlhf/<judge|bt>_kl<K>_seed<S>."""
  by = {}
  for f in files:
    name = os.path.basename(os.path.dirname(f))
    r, k, _ = name.split('_')
    r = {'judge': 'generative_judge', 'bt': 'bradley_terry'}[r]
    if (reward is None or r == reward) and (kl is None or k[2:] == kl):
      by.setdefault((r, k[2:]), []).append(_row(_load(f), 'preference'))
  return by


def _rlhf_reward(files):
  by = {r: rows for (r, _), rows in _rlhf_runs(files, kl='0.1').items()}
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
  better = (means.get('generative_judge', -1) >= means.get('bradley_terry', 9))
  return text, ('holds: judge ahead' if better else
                'no: Bradley-Terry ahead (the default here)')


def _if_hurts(files):
  rep = _load(next(f for f in files if f.endswith('report.json')))
  reruns = [_row(_load(f), 'preference') for f in files
            if '/if_rl/' in f and f.endswith('rerun.json')]
  from configs import cascade  # pylint: disable=g-import-not-at-top
  reward = cascade.RLHF_REWARD
  rlhf = _rlhf_runs([f for f in files if '/rlhf/' in f],
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
  recovered = pref('rlhf') > pref('sft')
  verdict = ('holds' if hurt and recovered else
             'RLHF recovers; IF-RL does not hurt here' if recovered else 'no')
  return text, verdict


def _kl(files):
  by = _rlhf_runs(files)
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
  if len(default) < 2:
    return text, 'open (one KL measured)'
  best = max(default, key=default.get)
  return text, f'KL {best} better here ({NAMES.get(cascade.RLHF_REWARD)})'


CLAIMS = [
    # runs/cascade_judge: bash scripts/main.sh --config=configs/cascade.py:judge
    # --workdir=runs/cascade_judge (main_job_judge/), where every rerun
    # below starts.
    Claim('Each RL stage improves its own domain',
          f'{RESULTS}/main_job/report.json', 'bash scripts/main.sh',
          _main_job),
    Claim('SFT leaves math part-learned; GRPO on math improves it',
          f'{RESULTS}/main_job/report.json|{RESULTS}/math_rl/*/rerun.json|'
          f'{RESULTS}/math_levels/sft_math_weight.json',
          'python -m experiments.rerun_stage --config=configs/cascade.py:judge --run=runs/cascade_judge '
          '--stage=math_rl --config.order=sft,math_rl --stage_seed=S '
          '--workdir=runs/math_rl/seedS', _math),
    Claim('MOPD reaches the math teacher in fewer steps than GRPO',
          f'{RESULTS}/mopd_vs_grpo/results.json',
          'python -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py:lr '
          '--config.init_from=runs/cascade_judge/code_rl '
          '--config.teacher=runs/cascade_judge/sft --workdir=runs/mopd_vs_grpo',
          _mopd),
    Claim('A generative pairwise judge as the RLHF reward',
          f'{RESULTS}/judge_agreement/agreement.json',
          'python -m experiments.judge_agreement --run=runs/cascade_judge '
          '--workdir=runs/agreement', _judge),
    Claim('RLHF with the judge (the paper) vs a Bradley-Terry model',
          f'{RESULTS}/rlhf/*_kl0.1_*/rerun.json',
          'python -m experiments.rerun_stage --config=configs/cascade.py:judge --run=runs/cascade_judge --stage=rlhf '
          '--config.stages.rlhf.reward=R --stage_seed=S '
          '--workdir=runs/rlhf/R_kl0.1_seedS', _rlhf_reward),
    Claim('IF-RL hurts alignment; RLHF recovers it',
          f'{RESULTS}/main_job/report.json|{RESULTS}/if_rl/*/rerun.json|'
          f'{RESULTS}/rlhf/bt_kl0.1_*/rerun.json',
          'python -m experiments.rerun_stage --config=configs/cascade.py:judge --run=runs/cascade_judge --stage=if_rl '
          '--stage_seed=S --workdir=runs/if_rl_S', _if_hurts),
    Claim("RLHF's KL coefficient: 0.03 (paper) vs 0.1 (this repository)",
          f'{RESULTS}/rlhf/*/rerun.json',
          'python -m experiments.rerun_stage --config=configs/cascade.py:judge --run=runs/cascade_judge --stage=rlhf '
          '--config.stages.rlhf.reward=R --config.stages.rlhf.rl.kl_coef=K '
          '--stage_seed=S --workdir=runs/rlhf/R_klK_seedS', _kl),
]


def section() -> str:
  lines = [BEGIN, '',
           '| the paper says | at CPU scale (from the files) | verdict | '
           'evidence | command |', '|---|---|---|---|---|']
  for c in CLAIMS:
    files = [f for pattern in c.files.split('|') for f in _glob(pattern)]
    if not files:
      text, verdict = 'not measured (no result files)', 'open'
    else:
      text, verdict = c.measure(files)
    where = ', '.join(f'`{p}`' for p in c.files.split('|'))
    lines.append(f'| {c.paper} | {text} | **{verdict}** | {where} | '
                 f'`{c.command}` |')
  lines += ['', END]
  return '\n'.join(lines)


def readme_with(text: str, readme: str) -> str:
  if BEGIN not in readme or END not in readme:
    raise ValueError(f'README.md has no status markers ({BEGIN} ... {END})')
  head, rest = readme.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  return head + text + tail


def main(argv: list[str]) -> int:
  text = section()
  path = os.path.join(ROOT, 'README.md')
  with open(path) as f:
    readme = f.read()
  if '--write' in argv:
    with open(path, 'w') as f:
      f.write(readme_with(text, readme))
    print(f'wrote the status section of {path}')
  elif '--check' in argv:
    if readme_with(text, readme) != readme:
      print('README.md: the status section is not what the results say; '
            'run python -m experiments.status --write', file=sys.stderr)
      return 1
    print('README.md status section matches docs/results')
  else:
    print(text)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
