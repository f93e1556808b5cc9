"""GRPO vs MOPD from the same checkpoint on one domain, over seeds: score against steps, steps to the teacher's score.

  python -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py \
      --workdir=runs/mopd_vs_grpo --config.init_from=runs/cascade/code_rl \
      --config.teacher=runs/cascade/sft

Writes results.json (every seed's curves with standard errors, the
teacher's score, steps to reach it, the ratio, provenance), curves.png (mean
and range over seeds) and a table. Started again, finished arms are read
back, not rerun.
"""

import json
import os
import time

import ml_collections
import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import domains
from cascade_jax import report
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax import utils
from experiments.curves import steps_to_close
from experiments.curves import steps_to_reach
from experiments.curves import summarize

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/mopd_vs_grpo.py', 'Experiment config.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.',
                               required=True)


FRACTIONS = (0.5, 0.9)


def _ratio(a, b):
  """a / b, or None when either is missing or b is 0 (e.g. a student that
  starts at its teacher's score: 0 steps each)."""
  return a / b if a is not None and b else None


def _arm_config(c, arm: str, seed: int) -> ml_collections.ConfigDict:
  rc = ml_collections.ConfigDict(c.base.to_dict())
  rc.seed = seed
  rc.init_from = c.init_from
  for part in ('rl', 'optim'):
    for k, v in (c.arms[arm].get(part) or {}).items():
      if k not in rc[part]:
        raise ValueError(f'mopd_vs_grpo: arms.{arm}.{part}.{k} is not a '
                         f'field of the RL config')
      rc[part][k] = v
  if rc.rl.algorithm == 'mopd':
    rc.teachers = ml_collections.ConfigDict({c.domain: c.teacher})
  return rc


def _curve(path: str, domain: str) -> dict:
  steps, scores = report.read_metrics(path, f'eval/{domain}/pass_rate')
  _, ses = report.read_metrics(path, f'eval/{domain}/pass_se')
  return dict(steps=steps, scores=scores, ses=ses)


def main(argv):
  del argv
  utils.quiet_logs()
  utils.enable_compilation_cache()
  c, wd = _CONFIG.value, _WORKDIR.value
  for name, path in (('init_from', c.init_from), ('teacher', c.teacher)):
    if not os.path.isdir(os.path.join(path, 'checkpoints')):
      raise FileNotFoundError(f'mopd_vs_grpo: --config.{name}={path!r} is '
                              'not a run directory with checkpoints')
  os.makedirs(wd, exist_ok=True)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    f.write(c.to_json_best_effort(indent=2))
  meta, t0 = utils.provenance(), time.perf_counter()
  base = c.base
  gen = rl.domain_options(base.data.to_dict(), c.domain)
  _, teacher, tok = train.restore_run(c.teacher)
  seeds = [int(s) for s in c.seeds]
  runs = {}
  for seed in seeds:
    # The teacher on each seed's eval prompts, as the arms are scored.
    evals = {c.domain: domains.generate(c.domain, split='eval',
                                        n=base.eval_n, seed=seed, **gen)}
    t = rollout.evaluate_model(teacher, tok, evals,
                               temperature=base.eval_temperature,
                               samples=base.eval_samples,
                               seed=seed)[c.domain]
    runs[seed] = dict(teacher=dict(score=t.pass_rate, se=t.pass_se))
    for arm in c.arms:
      d = os.path.join(wd, f'{arm}_seed{seed}')
      if not os.path.exists(os.path.join(d, 'rl_scores.json')):
        rl.run(_arm_config(c, arm, seed), d)
      curve = _curve(os.path.join(d, 'rl_metrics.jsonl'), c.domain)
      curve['steps_to_teacher'] = steps_to_reach(
          curve['steps'], curve['scores'], t.pass_rate)
      for frac in FRACTIONS:
        curve[f'steps_to_{int(frac * 100)}pct_gap'] = steps_to_close(
            curve['steps'], curve['scores'], t.pass_rate, frac)
      runs[seed][arm] = curve
  horizon = int(base.steps)
  summary = {arm: summarize([runs[s][arm]['steps_to_teacher'] for s in seeds],
                            horizon) for arm in c.arms}
  by_fraction = {
      f'{int(frac * 100)}pct_gap': {arm: summarize(
          [runs[s][arm][f'steps_to_{int(frac * 100)}pct_gap'] for s in seeds],
          horizon) for arm in c.arms} for frac in FRACTIONS}
  g, m = summary.get('grpo'), summary.get('mopd')
  ratio = None
  if g and m:
    ratio = dict(
        reached_only=_ratio(m['mean'], g['mean']),
        censored=_ratio(m['mean_censored'], g['mean_censored']),
        note=('censored: a seed that did not reach the teacher counts as '
              f'{horizon} steps (a lower bound), so with GRPO censored the '
              'ratio is an upper bound'))
    for key, arms in by_fraction.items():
      ratio[key] = _ratio(arms['mopd']['mean_censored'],
                          arms['grpo']['mean_censored'])
  start = float(np.mean([runs[s][next(iter(c.arms))]['scores'][0]
                         for s in seeds]))
  teacher_mean = float(np.mean([runs[s]['teacher']['score'] for s in seeds]))
  gains = {arm: dict(
      final=float(np.mean([runs[s][arm]['scores'][-1] for s in seeds])),
      gap_closed_final=float(np.mean(
          [(runs[s][arm]['scores'][-1] - runs[s][arm]['scores'][0]) /
           max(runs[s]['teacher']['score'] - runs[s][arm]['scores'][0], 1e-9)
           for s in seeds]))) for arm in c.arms}
  meta['wall_s'] = time.perf_counter() - t0
  results = dict(meta=meta, config=json.loads(c.to_json_best_effort()),
                 domain=c.domain, init_from=c.init_from, teacher=c.teacher,
                 seeds=seeds, start=start, teacher_score=teacher_mean,
                 runs={str(s): r for s, r in runs.items()},
                 steps_to_teacher=summary, steps_to_gap=by_fraction,
                 ratio_mopd_to_grpo=ratio,
                 end=gains)
  with open(os.path.join(wd, 'results.json'), 'w') as f:
    json.dump(results, f, indent=2)
  png = plot(results, os.path.join(wd, 'curves.png'))
  rows = []
  for arm in c.arms:
    s = summary[arm]
    rows.append([arm.upper(), f'{start:.3f}', f"{gains[arm]['final']:.3f}",
                 f"{gains[arm]['gap_closed_final']:+.2f}",
                 ' '.join('-' if x is None else str(x) for x in s['per_seed']),
                 f"{s['reached']}/{s['seeds']}",
                 '-' if s['mean'] is None else
                 f"{s['mean']:.1f} [{s['min']}, {s['max']}]"])
  print(f'teacher ({c.teacher}) {c.domain}: {teacher_mean:.3f} (mean over '
        f'seeds {seeds}; pass@1 T={base.eval_temperature:g}, '
        f'{base.eval_samples} samples x {base.eval_n} prompts)')
  print(utils.format_table(['arm', 'start', 'end', 'gap closed',
                            'steps to teacher (per seed)', 'reached',
                            'mean [min, max]'], rows))
  for key, arms in by_fraction.items():
    print(f'steps to close {key.replace("pct_gap", "%")} of the gap: ' + '; '.join(
        f"{arm.upper()} " + ' '.join('-' if x is None else str(x)
                                     for x in s['per_seed'])
        + f" (mean {s['mean_censored']:.1f})" for arm, s in arms.items()))
  if ratio:
    fmt = lambda x: '-' if x is None else f'{x:.2f}'
    print(f"MOPD / GRPO steps to the teacher: {fmt(ratio['reached_only'])} "
          f"(seeds that reached it), {fmt(ratio['censored'])} "
          f"({ratio['note']}); to 90% of the gap: "
          f"{fmt(ratio.get('90pct_gap'))}")
  print(f'plot: {png}')


def plot(results: dict, path: str) -> str:
  """Mean curve of each arm over seeds with its range, the teacher's score."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
  palette = ['tab:green', 'tab:red', 'tab:purple', 'tab:brown']
  colors = {'grpo': 'tab:blue', 'mopd': 'tab:orange'}
  for arm in results['steps_to_teacher']:
    if arm not in colors:
      colors[arm] = palette[(len(colors) - 2) % len(palette)]
    curves = [results['runs'][str(s)][arm] for s in results['seeds']]
    steps = curves[0]['steps']
    ys = np.asarray([cv['scores'][:len(steps)] for cv in curves])
    ax.plot(steps, ys.mean(0), marker='o', markersize=3,
            color=colors.get(arm), label=f'{arm.upper()} (mean of '
            f'{len(curves)} seeds)')
    ax.fill_between(steps, ys.min(0), ys.max(0), alpha=0.2,
                    color=colors.get(arm), linewidth=0)
  ax.axhline(results['teacher_score'], linestyle='--', color='gray',
             linewidth=1)
  ax.annotate(f"teacher {results['teacher_score']:.3f}",
              (0.01, results['teacher_score']),
              xycoords=('axes fraction', 'data'), va='bottom', fontsize=8,
              color='gray')
  ax.set(xlabel='step', ylabel='eval pass@1',
         title=f"{results['domain']}: GRPO vs MOPD from "
         f"{os.path.basename(results['init_from'].rstrip('/'))} "
         '(band: range over seeds)')
  ax.title.set_fontsize(9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc='lower right')
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


if __name__ == '__main__':
  app.run(main)
