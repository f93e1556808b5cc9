"""The paper's MOPD efficiency experiment: from one checkpoint, GRPO vs MOPD on one domain, over seeds.

  python -m experiments.mopd_vs_grpo --config=configs/mopd_vs_grpo.py \
      --workdir=runs/mopd_vs_grpo --config.init_from=runs/cascade/code_rl \
      --config.teacher=runs/cascade/sft --config.domain=math

The paper's setting: a student that later stages moved away from its math
teacher (here the checkpoint after code RL), the SFT checkpoint as the math
teacher. Both arms start from `init_from` with the same prompts, batch size
and lr in each seed; GRPO learns from the domain's verifier, MOPD from the
teacher's per-token log-probs. Every `eval_every` steps both are scored as
the cascade scores a stage (pass@1 at T=1, the mean over 2 samples of 256
prompts). The result (results.json, curves.png): the curves, the teacher's
score, the steps each arm needs to reach it per seed, their mean and
spread, and the ratio MOPD steps / GRPO steps.
"""

import ml_collections

from configs import rl as rl_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.init_from = ''
  c.teacher = ''
  c.domain = 'math'
  c.seeds = (0, 1, 2)
  c.base = rl_config.get_config('quick' if arg == 'quick' else None)
  c.base.data.domain = c.get_ref('domain')
  c.base.steps = 30
  c.base.eval_every = 2
  c.base.eval_n = 256
  c.base.eval_temperature, c.base.eval_samples = 1.0, 2
  c.base.checkpoint_every = 30
  c.base.keep_checkpoints = 1
  c.base.optim.warmup_steps = 2
  # The cascade's MOPD stage: 16 prompts x 4 samples, 48 new tokens.
  c.base.rl.prompts_per_step, c.base.rl.rollouts_per_prompt = 16, 4
  c.base.rl.max_new_tokens = 48
  # Per arm: its rl (and optim) settings on top of base's (MOPD as in the
  # cascade: no group filter, a cut response still teaches per token).
  # More arms are a flag away, e.g. MOPD at another learning rate:
  #   --config.arms.mopd_lr1e3='{"rl": {"algorithm": "mopd", ...}, ...}'
  # or in a copy of this file.
  c.arms = ml_collections.ConfigDict(dict(
      grpo=dict(rl=dict(algorithm='grpo'), optim=dict()),
      mopd=dict(rl=dict(algorithm='mopd', dynamic_filtering=False,
                        overlong='none'), optim=dict())))
  if arg == 'lr':
    # MOPD's per-token advantage (log pi_teacher - log pi_student) is not
    # normalised as GRPO's group advantage is: the same lr moves it less.
    c.arms.mopd_lr1e3 = ml_collections.ConfigDict(dict(
        rl=dict(algorithm='mopd', dynamic_filtering=False, overlong='none'),
        optim=dict(lr=1e-3)))
  if arg == 'gap':
    # Rule 14 (docs/claims/14_mopd_gap.json): a teacher well above the
    # student (math_rl trained 90 steps), 5 seeds, the same sampled
    # rollouts a step in both arms (16 x 4; GRPO without refills), and
    # MOPD's lr warmed up linearly from a tenth over 30 steps (the paper's
    # 2e-7 -> 2e-6 over 30 steps; RECIPE.md).
    c.seeds = (0, 1, 2, 3, 4)
    c.arms.grpo.rl.max_refill_rounds = 0
    c.arms.mopd.optim.warmup_steps = 30
    c.arms.mopd.optim.warmup_init_frac = 0.1
  if arg == 'quick':
    c.seeds = (0,)
    c.base.steps, c.base.eval_every, c.base.eval_n = 2, 1, 8
    c.base.checkpoint_every = 2
    c.base.rl.prompts_per_step, c.base.rl.max_new_tokens = 2, 16
  elif arg not in (None, '', 'lr', 'gap'):
    raise ValueError(f'configs/mopd_vs_grpo.py: unknown argument {arg!r} '
                     '(known: quick, lr, gap)')
  return c


def sweep():
  for domain in ('math', 'instruction_following'):
    yield {'config.domain': domain}
