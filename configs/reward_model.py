"""The Bradley-Terry reward model stage, from a run's checkpoint (SFT), on preference pairs.

  python -m experiments.reward_model --config=configs/reward_model.py \
      --workdir=runs/rm --config.init_from=runs/sft

Reports held-out pairwise accuracy (rm_scores.json); the RLHF stage uses it
as its reward with `--config.reward_model=runs/rm`.
"""

import ml_collections

from cascade_jax import train


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # mesh, rules (logical axis -> mesh axes) and memory (remat, scan_layers,
  # logits_chunk, compute_dtype): see cascade_jax/train/_setup.py.
  c.update(train.placement_defaults())
  c.init_from = ''
  c.data = ml_collections.ConfigDict(dict(n_train=2048, levels=(1, 2, 3),
                                          seq_len=64,
                                          cross_prompt_negatives=True))
  c.optim = ml_collections.ConfigDict(dict(
      lr=3e-4, warmup_steps=10, decay_steps=100, end_lr_frac=0.1, b1=0.9,
      b2=0.98, weight_decay=0.0, clip_norm=1.0, schedule='cosine',
      warmup_init_frac=0.0, moment_dtype='float32'))
  c.batch_size = 32             # pairs per step
  c.steps = 100
  c.eval_n = 256
  c.log_every = 20
  c.checkpoint_every = 50
  c.keep_checkpoints = 1
  if arg == 'quick':
    c.steps, c.eval_n, c.batch_size, c.data.n_train = 6, 32, 8, 64
    c.log_every, c.checkpoint_every = 2, 3
  elif arg:
    raise ValueError(f'configs/reward_model.py: unknown argument {arg!r}')
  return c


def sweep():
  for lr in (1e-4, 3e-4, 1e-3):
    yield {'config.optim.lr': lr}
