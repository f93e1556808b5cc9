"""Recovering what a cascade stage forgot: MOPD with each damaged domain's best earlier checkpoint as its teacher, against GRPO on the same domains.

  python -m experiments.recover --run=runs/forgetting/seed=0 --config.seed=0 \
      --workdir=runs/recover/seed0

From the run's stage `--after` (long_context_rl, the stage the forgetting
sweep found to do the damage), two arms: `mopd_recover` (MOPD on
`--domains`, each domain's teacher the stage before `--after` with the
highest pass@1 in it, read from the run's stage.json files) and
`grpo_recover` (GRPO on the same domains with the outcome rewards), at the
same sampled rollouts a step (configs/cascade.py: 16 prompts x 4, no
refills), steps and learning rate. Each is scored against its start on
every domain as the cascade scores a stage (the run's own seed:
--config.seed), in WORKDIR/mopd/rerun.json and WORKDIR/grpo/rerun.json,
with the teachers chosen, every candidate's score and the provenance.
`--stage_seed` seeds the arms' training only (reruns over seeds from one
run are scored on the same prompts with the same sampling keys).
"""

import json
import os

import ml_collections
from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import cascade
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/cascade.py', 'The cascade config the run used.',
    lock_config=True)
_RUN = flags.DEFINE_string('run', None, 'A cascade run directory.',
                           required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where the arms write.',
                               required=True)
_AFTER = flags.DEFINE_string('after', 'long_context_rl', 'The stage that did '
                             'the damage; both arms start from it.')
_DOMAINS = flags.DEFINE_list('domains', ['math', 'code'], 'The damaged '
                             'domains both arms train on.')
_ARMS = flags.DEFINE_list('arms', ['mopd', 'grpo'], 'Which arms to run.')
_SEED = flags.DEFINE_integer('stage_seed', None, "The arms' training seed "
                             "(default: the cascade's); the evaluation keeps "
                             "the cascade's.")


def best_teachers(config, run: str, after: str, domains) -> tuple[dict, dict]:
  """({domain: {stage, score}}, {domain: {stage: score}}): per domain the
  stage before `after` (in the cascade's order) with the highest pass@1 in
  it, the earliest on a tie."""
  names = [s.name for s in cascade.plan(config)]
  if after not in names:
    raise ValueError(f'--after={after!r} is not a stage of the cascade '
                     f'({names})')
  scores = {}
  for name in names[:names.index(after)]:
    path = os.path.join(run, name, 'stage.json')
    if os.path.exists(path):
      with open(path) as f:
        rec = json.load(f)
      for d, sc in (rec.get('scores') or {}).items():
        scores.setdefault(d, {})[name] = sc['pass_rate']
  missing = [d for d in domains if d not in scores]
  if missing:
    raise ValueError(f'{run}: no stage before {after} scored {missing}')
  best = {d: max(scores[d].items(), key=lambda kv: kv[1]) for d in domains}
  return ({d: dict(stage=s, score=v) for d, (s, v) in best.items()},
          {d: scores[d] for d in domains})


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  c = ml_collections.ConfigDict(_CONFIG.value.to_dict())
  c.order += ',mopd_recover,grpo_recover'
  teachers, candidates = best_teachers(c, _RUN.value, _AFTER.value,
                                       _DOMAINS.value)
  for name in ('mopd_recover', 'grpo_recover'):
    st = c.stages[name]
    st.init_from = _AFTER.value
    st.data.domain = ','.join(_DOMAINS.value)
    st.data.per_domain = {d: {'split_by': 'prompt'} for d in _DOMAINS.value}
  c.stages.mopd_recover.teachers = {d: t['stage'] for d, t in teachers.items()}
  print('[recover] teachers: ' + ', '.join(
      f"{d} <- {t['stage']} ({t['score']:.3f})" for d, t in teachers.items()))
  for arm in _ARMS.value:
    rows = cascade.rerun_stage(
        c, _RUN.value, f'{arm}_recover', os.path.join(_WORKDIR.value, arm),
        stage_seed=_SEED.value,
        extra=dict(recover=dict(after=_AFTER.value, teachers=teachers,
                                candidates=candidates)))
    print(cascade.rerun_table(rows, f'{arm}: domain'), flush=True)

if __name__ == '__main__':
  app.run(main)
