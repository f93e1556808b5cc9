"""The cascade's report: the forgetting matrix (stages x domains), per-stage changes, curves, times.

Written to <workdir>/report/: report.json (for machines), report.md (tables
with the PNGs inlined), matrix.png, deltas.png, curves.png.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from cascade_jax import domains
from cascade_jax import utils
from cascade_jax.report._plots import plot_matrix
from cascade_jax.report._plots import plot_stage_panels
from cascade_jax.report._plots import read_metrics
from cascade_jax.report._plots import StagePanel

SHORT = {'instruction_following': 'IF', 'multi_domain': 'multi',
         'long_context': 'long', 'preference': 'pref'}


def matrix(records: Sequence[dict], key: str = 'pass_rate'
           ) -> tuple[list[str], list[str], np.ndarray]:
  """(stage names, domains, [stages, domains]) over the stages that were scored."""
  scored = [r for r in records if r.get('scores')]
  doms = sorted({d for r in scored for d in r['scores']})
  vals = np.asarray([[r['scores'].get(d, {}).get(key, np.nan) for d in doms]
                     for r in scored], np.float64).reshape(len(scored),
                                                           len(doms))
  return [r['name'] for r in scored], doms, vals


def deltas(records: Sequence[dict], key: str = 'pass_rate') -> np.ndarray:
  """Each stage's change on every domain against the stage it started from."""
  names, _, vals = matrix(records, key)
  out = np.full_like(vals, np.nan)
  for i, r in enumerate(r for r in records if r.get('scores')):
    if r['init_from'] in names:
      out[i] = vals[i] - vals[names.index(r['init_from'])]
  return out


def cascade_report(workdir: str, records: Sequence[dict],
                   meta: dict | None = None) -> dict:
  """Writes the report; returns {'markdown', 'json', 'table'} (table: text).

  `meta`: where the run came from (`utils.provenance()`, plus wall time and
  seed), kept in report.json with the resolved config (config.json).
  """
  out_dir = os.path.join(workdir, 'report')
  os.makedirs(out_dir, exist_ok=True)
  names, doms, vals = matrix(records)
  dvals = deltas(records)
  by_name = {r['name']: r for r in records}
  cols = [SHORT.get(d, d) for d in doms]

  def row_label(n):
    r = by_name[n]
    own = ','.join(SHORT.get(d, d) for d in r.get('domains', []))
    return f'{n} [{own}]' if own else n

  metric = metric_label(records)
  plot_matrix(vals, [row_label(n) for n in names], cols,
              os.path.join(out_dir, 'matrix.png'),
              title=f'{metric} after each stage')
  plot_matrix(dvals, [row_label(n) for n in names], cols,
              os.path.join(out_dir, 'deltas.png'), diverging=True,
              fmt='{:+.2f}',
              title='Change against the stage each one started from')
  panels, on_policy = [], {}
  for r in records:
    path = os.path.join(workdir, r['name'], 'rl_metrics.jsonl')
    if r['kind'] in ('grpo', 'mopd') and os.path.exists(path):
      panels.append(stage_panel(r, path, by_name))
      on_policy[r['name']] = on_policy_check(path)
  plot_stage_panels(panels, os.path.join(out_dir, 'curves.png'),
                    title=f'RL stages ({metric_label(records)} for eval)')

  header = ['stage', 'kind', 'from'] + cols + ['train s', 'eval s',
                                               'compile s', 'mismatch max']
  rows = []
  for n, v in zip(names, vals):
    r = by_name[n]
    own = set(r.get('domains', []))
    cells = [f"{x:.3f}{'*' if d in own else ''}" for d, x in zip(doms, v)]
    worst = on_policy.get(n, {}).get('sampler_mismatch_max')
    rows.append([n, r['kind'], r['init_from'] or '-'] + cells +
                [round(r['train_s']), round(r['eval_s']), _compile_cell(r),
                 '-' if worst is None else f'{worst:.1e}'])
  table = utils.format_table(header, rows)
  own_gains = {n: {d: float(dv[doms.index(d)]) for d in by_name[n]['domains']
                   if d in doms}
               for n, dv in zip(names, dvals)
               if by_name[n]['kind'] in ('grpo', 'mopd')}
  rm = [r for r in records if r['kind'] == 'reward_model']
  total = sum(r['train_s'] + r['eval_s'] for r in records)
  compiled = [x for r in records for x in r.get('compiles', {}).values()]
  compile_s = sum(utils.compile_seconds(r.get('compiles', {}))
                  for r in records)
  config = None
  if os.path.exists(os.path.join(workdir, 'config.json')):
    with open(os.path.join(workdir, 'config.json')) as f:
      config = json.load(f)
  data = dict(meta=dict(meta or {}), config=config,
              stages=list(records), domains=doms, matrix_stages=names,
              metric=metric, pass_rate=vals.tolist(), deltas=dvals.tolist(),
              own_domain_change=own_gains, total_s=total,
              compile_s=compile_s if compiled else None,
              on_policy=on_policy,
              reward_model={r['name']: dict(accuracy=r.get('accuracy'),
                                            accuracy_before=r.get(
                                                'accuracy_before'))
                            for r in rm},
              judge={r['name']: r.get('judge') for r in records
                     if r['kind'] == 'judge'})
  jpath = os.path.join(out_dir, 'report.json')
  with open(jpath, 'w') as f:
    json.dump(data, f, indent=2, default=_nan_safe)
  run = ''
  if meta:
    run = (f"Run of commit {meta.get('commit', '?')[:10]}"
           + (' (with local changes)' if meta.get('dirty') else '')
           + f", {meta.get('date', '?')}, seed {meta.get('seed', '?')}, on "
           f"{meta.get('machine', '?')}: `{meta.get('command', '?')}`"
           + (f", {meta['wall_s']:.0f}s wall" if 'wall_s' in meta else '')
           + '.\n\n')
  md = ['# Cascade report', '',
        run + f'{len(records)} stages, {total:.0f}s of stage time'
        + (f' ({compile_s:.0f}s of it compiling and tracing: '
           f'{sum(x["compiles"] for x in compiled)} XLA compiles)'
           if compiled else '') + f'. {metric} '
        'on every domain\'s eval split after each stage; * marks the '
        "stage's own domains.", '', '```', table, '```', '',
        '![pass rates](matrix.png)', '',
        '`compile s`: the stage\'s seconds of XLA compiles, tracing and '
        'lowering, training and evaluation together (part of its train and '
        'eval seconds). '
        + ('`eval s` ran in an evaluation process beside the next stages\' '
           'training (`eval_worker`), so the stage times overlap and add up '
           'to more than the wall time. '
           if any(r.get('scored_in') == 'process' for r in records) else '')
        + '`mismatch max`: the largest |log pi_learner - log pi_sampler| over '
        'the response tokens of any step of an RL stage (on-policy: float '
        'rounding only).', '', '## What each stage changed', '',
        'Against the stage it started from (its `from`):', '',
        '![changes](deltas.png)', '']
  md.append('Own-domain changes, against two standard errors of the '
            'difference, paired over the eval prompts (per prompt: its pass '
            'rate over the samples after the stage minus before; without '
            'per-prompt results, each rate\'s own standard error):')
  md.append('')
  for n, g in own_gains.items():
    start = by_name[n]['init_from']
    md.append(f'- {n}: ' + ', '.join(
        f'{SHORT.get(d, d)} {v:+.3f} ('
        + ('beyond' if abs(v) > 2 * se_of_change(by_name[start], by_name[n], d)
           else 'within') + ' noise)'
        for d, v in g.items()))
  for r in rm:
    md += ['', f"Reward model `{r['name']}`: held-out pairwise accuracy "
           f"{r.get('accuracy', float('nan')):.3f} (before training "
           f"{r.get('accuracy_before', float('nan')):.3f})."]
  for r in records:
    j = r.get('judge') if r['kind'] == 'judge' else None
    if j:
      before = (j.get('before') or {}).get('agreement', float('nan'))
      md += ['', f"Generative judge `{r['name']}`: held-out agreement with the "
             f"rule judge {j['agreement']:.3f} over both orders of {j['n']} "
             f"pairs (both orders right {j['both_orders']:.3f}, position bias "
             f"{j['position_bias']:+.3f}; before training {before:.3f})."]
  md += ['', '## Training curves', '', '![curves](curves.png)', '']
  mpath = os.path.join(out_dir, 'report.md')
  with open(mpath, 'w') as f:
    f.write('\n'.join(md))
  return dict(markdown=mpath, json=jpath, table=table)


def _compile_cell(record: dict) -> int | str:
  """A stage's compile seconds (train and eval), or '-' for a record from
  before they were counted."""
  if 'compiles' not in record:
    return '-'
  return round(utils.compile_seconds(record['compiles']))


def stage_panel(record: dict, metrics_path: str,
                by_name: dict[str, dict]) -> StagePanel:
  """An RL stage's panel: its training signal, its own domains' pass@1 at
  its start (the stage it started from) and end, the mismatch per step."""
  if record['kind'] == 'mopd':
    signal = ('reverse KL to teachers',) + read_metrics(metrics_path,
                                                        'reverse_kl')
  elif by_name.get(record.get('reward_model'), {}).get('kind') == 'judge':
    # A judge's reward is a win rate within the group: its mean is 0.5 at
    # every step; the drift from the reference says what RLHF did.
    signal = ('KL to reference',) + read_metrics(metrics_path, 'kl')
  elif record.get('reward_model'):
    signal = ('reward-model score',) + read_metrics(metrics_path,
                                                    'reward_mean')
  else:
    signal = ('sampled reward',) + read_metrics(metrics_path, 'reward_mean')
  start = by_name.get(record['init_from'], {}).get('scores', {})
  end = record.get('scores', {})
  evals = {SHORT.get(d, d): (start[d]['pass_rate'], end[d]['pass_rate'])
           for d in record.get('domains', []) if d in start and d in end}
  return StagePanel(
      name=record['name'], signal=signal, evals=evals,
      mismatch=read_metrics(metrics_path, 'sampler_mismatch_max'),
      on_eval_scale=signal[0] == 'sampled reward')


def on_policy_check(path: str) -> dict[str, float]:
  """An RL stage's worst step: learner-vs-sampler log-prob gap and dropped tokens.

  Maxima over the steps of `rl_metrics.jsonl`: `sampler_mismatch_max`, the
  mean gap's worst step, and the largest dropped-token fraction of each
  forward kind (learner, reference, teacher, reward model); NaN when a stage
  logged none.
  """
  keys = ('sampler_mismatch_max', 'sampler_mismatch_mean', 'dropped_learner',
          'dropped_reference', 'dropped_teacher', 'dropped_reward_model')
  out = {}
  for k in keys:
    _, vals = read_metrics(path, k)
    if vals or k.startswith('sampler'):
      out[k] = float(max(vals)) if vals else float('nan')
  return out


def metric_label(records: Sequence[dict]) -> str:
  """What the matrix holds, from the stages' evaluation settings."""
  ev = next((r['eval'] for r in records if r.get('eval')), {})
  t, k = ev.get('temperature', 0.0), ev.get('samples', 1)
  if not t:
    return 'Greedy pass rate'
  return f'Pass@1 (T={t:g}, mean over {k} samples)'


def se_of_change(a: dict, b: dict, domain: str) -> float:
  """Standard error of the difference of two stages' pass rates.

  Paired over the eval prompts when both stages recorded per-prompt pass
  rates on the same prompts (the cascade does); else from each stage's own
  standard error (clustered by prompt), or binomial over the prompts, as if
  the two were independent (which overstates the noise of a difference).
  """
  sa, sb = a['scores'][domain], b['scores'][domain]
  if sa.get('prompt_pass') and sb.get('prompt_pass'):
    se = domains.paired_se(list(sa['prompt_pass'].items()),
                           list(sb['prompt_pass'].items()))
    if np.isfinite(se):
      return se
  var = 0.0
  for sc in (sa, sb):
    se = sc.get('pass_se')
    if se is None or not np.isfinite(se):
      p, n = sc['pass_rate'], max(sc.get('prompts', sc.get('n', 1)), 1)
      se = np.sqrt(p * (1 - p) / n)
    var += se ** 2
  return float(np.sqrt(var))


def _nan_safe(x):
  return None if isinstance(x, float) and np.isnan(x) else str(x)


def cascade_sweep_report(run_dirs: Sequence[str], out_dir: str) -> dict:
  """The forgetting matrix over several runs (seeds): mean and spread.

  Reads each run's stage records; stages and domains must match. Writes
  sweep_report.json / .md and sweep_matrix.png (mean, ± std in each cell).
  """
  mats, names, doms = [], None, None
  for d in run_dirs:
    with open(os.path.join(d, 'report', 'report.json')) as f:
      rep = json.load(f)
    if names is not None and (rep['matrix_stages'] != names or
                              rep['domains'] != doms):
      raise ValueError(f'{d}: its stages / domains differ from the first run')
    names, doms = rep['matrix_stages'], rep['domains']
    mats.append(np.asarray(rep['pass_rate'], np.float64))
    metric = rep.get('metric', 'Greedy pass rate')
  stack = np.stack(mats)
  mean, std = stack.mean(0), stack.std(0, ddof=1 if len(mats) > 1 else 0)
  cols = [SHORT.get(x, x) for x in doms]
  os.makedirs(out_dir, exist_ok=True)
  plot_matrix(mean, names, cols, os.path.join(out_dir, 'sweep_matrix.png'),
              spread=std, title=f'{metric} after each stage: mean ± std over '
              f'{len(mats)} runs')
  rows = [[n] + [f'{m:.3f}±{s:.3f}' for m, s in zip(mr, sr)]
          for n, mr, sr in zip(names, mean, std)]
  table = utils.format_table(['stage'] + cols, rows)
  jpath = os.path.join(out_dir, 'sweep_report.json')
  with open(jpath, 'w') as f:
    json.dump(dict(runs=list(run_dirs), stages=names, domains=doms,
                   mean=mean.tolist(), std=std.tolist()), f, indent=2)
  mpath = os.path.join(out_dir, 'sweep_report.md')
  with open(mpath, 'w') as f:
    f.write(f'# Cascade over {len(mats)} runs\n\n{metric}, mean ± '
            f'standard deviation across runs.\n\n```\n{table}\n```\n\n'
            '![matrix](sweep_matrix.png)\n')
  return dict(markdown=mpath, json=jpath, table=table)
