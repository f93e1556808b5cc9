"""GRPO vs MOPD from the same checkpoint on one domain: score against steps, and steps to the teacher's score.

  python -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py \
      --workdir=runs/mopd_vs_grpo --config.init_from=runs/cascade/multi_domain_rl \
      --config.teacher=runs/cascade/sft
"""

import json
import os

import ml_collections
from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import domains
from cascade_jax import report
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax import utils

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/mopd_vs_grpo.py', 'Experiment config.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.',
                               required=True)


def steps_to_reach(steps, scores, target):
  """The first step whose score reaches target, or None."""
  return next((s for s, v in zip(steps, scores) if v >= target), None)


def main(argv):
  del argv
  utils.quiet_logs()
  utils.enable_compilation_cache()
  c, wd = _CONFIG.value, _WORKDIR.value
  os.makedirs(wd, exist_ok=True)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    f.write(c.to_json_best_effort(indent=2))
  base = c.base
  evals = {c.domain: domains.generate(
      c.domain, split='eval', n=base.eval_n, seed=base.seed,
      **{k: v for k, v in base.data.to_dict().items()
         if k not in ('domain', 'n_train')})}
  _, teacher, tok = train.restore_run(c.teacher)
  target = rollout.evaluate_model(teacher, tok, evals)[c.domain].pass_rate
  curves, rows = {}, []
  for arm in ('grpo', 'mopd'):
    rc = ml_collections.ConfigDict(base.to_dict())
    rc.init_from = c.init_from
    rc.rl.algorithm = arm
    if arm == 'mopd':
      rc.teachers = ml_collections.ConfigDict({c.domain: c.teacher})
      rc.rl.dynamic_filtering = False
    rl.run(rc, os.path.join(wd, arm))
    steps, scores = report.read_metrics(
        os.path.join(wd, arm, 'rl_metrics.jsonl'),
        f'eval/{c.domain}/pass_rate')
    curves[arm.upper()] = (steps, scores)
    rows.append([arm.upper(), scores[0], max(scores), scores[-1],
                 steps_to_reach(steps, scores, target) or '-'])
  png = report.plot_curves(
      curves, os.path.join(wd, 'curves.png'), ylabel='greedy pass rate',
      title=f'{c.domain}: GRPO vs MOPD from the same checkpoint',
      hlines={f'teacher {target:.3f}': target})
  table = utils.format_table(['arm', 'start', 'best', 'end',
                              'steps to teacher'], rows)
  with open(os.path.join(wd, 'results.json'), 'w') as f:
    json.dump(dict(domain=c.domain, teacher_score=target,
                   curves={k: dict(steps=s, scores=v)
                           for k, (s, v) in curves.items()},
                   steps_to_teacher={r[0]: r[4] for r in rows}), f, indent=2)
  print(f'teacher ({c.teacher}) {c.domain} pass rate {target:.3f}')
  print(table)
  print(f'plot: {png}')


if __name__ == '__main__':
  app.run(main)
