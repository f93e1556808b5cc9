"""How often the RLHF rewards agree with the rule judge: the generative judge beside the Bradley-Terry model.

  python -m experiments.judge_agreement --run=runs/cascade --workdir=runs/agreement

On held-out preference prompts, two kinds of pairs:
  pairs    the domain's chosen / rejected replies (what both were trained
           on, held out);
  samples  two replies the policy (`--policy`, default the cascade's SFT)
           samples at T=1 for one prompt, kept where the rule judge scores
           them differently (what RLHF asks the reward to rank).
Agreement: the reward ranks the pair as the rule judge does. The judge
reads each pair in both orders (its order-averaged preference; the greedy
verdict in each order is reported too); the Bradley-Terry model compares
two scores. Writes agreement.json (with provenance) and prints a table.
"""

import json
import os
import time

import numpy as np
from absl import app
from absl import flags

from cascade_jax import domains
from cascade_jax import reward_model
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax import utils

_RUN = flags.DEFINE_string('run', None, 'A cascade run directory.',
                           required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where to write.',
                               required=True)
_RM = flags.DEFINE_string('rm', 'rm', 'The Bradley-Terry stage.')
_JUDGE = flags.DEFINE_string('judge', 'judge', "The judge stage ('': the "
                              'Bradley-Terry model alone, for a run without '
                              'a judge, e.g. the default main job).')
_POLICY = flags.DEFINE_string('policy', 'sft', 'The stage whose samples are '
                              'ranked.')
_N = flags.DEFINE_integer('n', 256, 'Held-out prompts.')
_SEED = flags.DEFINE_integer('seed', 0, 'Prompts and sampling seed.')


def agreement_table(bt, judge, records, first, second, truth) -> dict:
  """Each reward's agreement with `truth` (1: first better, 0: second);
  `judge` None: the Bradley-Terry model's alone."""
  truth = np.asarray(truth, bool)
  s1, s2 = bt(records, first), bt(records, second)
  out = dict(n=len(records),
             bradley_terry=float(np.mean((s1 > s2) == truth)),
             se=float(np.sqrt(0.25 / max(len(records), 1))))
  if judge is None:
    return out
  items = [(reward_model.Judge.question(r), a, b)
           for r, a, b in zip(records, first, second)]
  p = judge.prefers(items)
  p_ab, greedy = judge.p_first(items + [(q, b, a) for q, a, b in items])
  n = len(items)
  verdict_right = np.concatenate([(greedy[:n] == 0) == truth,
                                  (greedy[n:] == 1) == truth])
  verdict_right &= np.concatenate([greedy[:n] != 2, greedy[n:] != 2])
  return dict(
      out, judge=float(np.mean((p > 0.5) == truth)),
      judge_greedy_verdicts=float(np.mean(verdict_right)),
      judge_position_bias=float(np.mean(p_ab) - 0.5))


def main(argv):
  del argv
  utils.quiet_logs()
  utils.enable_compilation_cache()
  meta, t0 = utils.provenance(), time.perf_counter()
  run = _RUN.value
  bt = reward_model.load(os.path.join(run, _RM.value))
  judge = None
  if _JUDGE.value:
    judge_fn = reward_model.load(os.path.join(run, _JUDGE.value))
    if not isinstance(judge_fn, reward_model.JudgeReward):
      raise ValueError(f'{_JUDGE.value}: not a judge run')
    judge = judge_fn.judge
  with open(os.path.join(run, _JUDGE.value or _RM.value, 'config.json')) as f:
    levels = tuple(json.load(f)['data']['levels'])
  held = domains.generate('preference', split='eval', n=_N.value,
                          seed=_SEED.value, levels=levels)
  out = dict(meta=meta, run=run, policy=_POLICY.value, seed=_SEED.value,
             judge=_JUDGE.value)
  out['pairs'] = agreement_table(
      bt, judge, held, [r['chosen'] for r in held],
      [r['rejected'] for r in held], [True] * len(held))
  # Two samples of the policy for each prompt, ranked by the rule judge.
  _, policy, tok = train.restore_run(os.path.join(run, _POLICY.value))
  cfg = rollout.SampleConfig(max_new_tokens=32, temperature=1.0)
  import jax  # pylint: disable=g-import-not-at-top
  a = rollout.responses_for(policy, tok, held, cfg=cfg,
                            key=jax.random.key(_SEED.value))
  b = rollout.responses_for(policy, tok, held, cfg=cfg,
                            key=jax.random.key(_SEED.value + 1))
  dom = domains.get('preference')
  ra = [s.reward for s in dom.verify(held, a)]
  rb = [s.reward for s in dom.verify(held, b)]
  keep = [i for i in range(len(held)) if ra[i] != rb[i]]
  out['samples'] = agreement_table(
      bt, judge, [held[i] for i in keep], [a[i] for i in keep],
      [b[i] for i in keep], [ra[i] > rb[i] for i in keep])
  out['samples']['of_prompts'] = len(held)
  out['meta']['wall_s'] = time.perf_counter() - t0
  os.makedirs(_WORKDIR.value, exist_ok=True)
  path = os.path.join(_WORKDIR.value, 'agreement.json')
  with open(path, 'w') as f:
    json.dump(out, f, indent=2)
  cols = [('Bradley-Terry', 'bradley_terry', '.3f')] + (
      [('judge', 'judge', '.3f'),
       ('judge greedy (each order)', 'judge_greedy_verdicts', '.3f'),
       ('judge P(A)-0.5', 'judge_position_bias', '+.3f')] if judge else [])
  rows = [[k, out[k]['n']] + [format(out[k][c], f) for _, c, f in cols]
          + [f"{out[k]['se']:.3f}"] for k in ('pairs', 'samples')]
  print(utils.format_table(['pairs of', 'n'] + [h for h, _, _ in cols]
                           + ['SE <='], rows))
  print(f'written: {path}')


if __name__ == '__main__':
  app.run(main)
