"""The paper's MOPD efficiency experiment: from one checkpoint, GRPO vs MOPD on one domain.

  python -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py \
      --workdir=runs/mopd_vs_grpo --config.init_from=runs/cascade/multi_domain_rl \
      --config.teacher=runs/cascade/sft --config.domain=math

Both arms start from `init_from` with the same prompts, batch size and lr;
GRPO learns from the domain's verifier, MOPD from `teacher`'s per-token
log-probs. The result: eval score against steps for both, the teacher's
score, and the steps each arm needed to reach it (results.json, curves.png).
"""

import ml_collections

from configs import rl as rl_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.init_from = ''
  c.teacher = ''
  c.domain = 'math'
  c.base = rl_config.get_config('quick' if arg == 'quick' else None)
  c.base.data.domain = c.get_ref('domain')
  c.base.steps = 60
  c.base.eval_every = 10
  c.base.rl.prompts_per_step, c.base.rl.rollouts_per_prompt = 16, 4
  c.base.rl.max_new_tokens = 48
  if arg == 'quick':
    c.base.steps, c.base.eval_every, c.base.eval_n = 2, 1, 8
  elif arg:
    raise ValueError(f'configs/mopd_vs_grpo.py: unknown argument {arg!r}')
  return c


def sweep():
  for domain in ('math', 'instruction_following'):
    yield {'config.domain': domain}
