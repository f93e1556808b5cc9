"""One RL stage (GRPO by default, or MOPD) from a previous run's checkpoint.

Launch (after configs/sft.py; about 3 minutes on 2 CPU cores):

  python -m experiments.rl --config=configs/rl.py --workdir=runs/rl_math \
      --config.init_from=runs/sft
  python -m experiments.rl --config=configs/rl.py:mopd --workdir=runs/mopd \
      --config.init_from=runs/rl_code --config.teachers.math=runs/sft

Run again after a kill, it resumes from its last checkpoint.
"""

import ml_collections

from cascade_jax import train


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # mesh, rules (logical axis -> mesh axes) and memory (remat, scan_layers,
  # logits_chunk, compute_dtype): see cascade_jax/train/_setup.py.
  c.update(train.placement_defaults())
  c.init_from = ''                   # a run directory (SFT or an RL stage)
  c.data = ml_collections.ConfigDict(dict(
      domain='math', n_train=4096, levels=(1, 2, 3), split_by='prompt',
      files='', eval_files=''))
  # data.domain may list several domains, comma-separated (a mixed stage).
  # domain=nemo_gym trains on NeMo-Gym RL rows: data.files (comma-separated
  # JSONL), data.eval_files (else a held-out share of the prompts); see
  # cascade_jax/domains/nemo_gym_rl.py.
  # rl: see cascade_jax/rl/_config.py. updates_per_batch: optimizer steps
  # per batch (1: strictly on-policy); micro_batches: each step's gradient
  # accumulated over that many parts of the batch (the same objective; what
  # fits a device's memory). sampler_dtype: the sampler's copy of the
  # weights ('bfloat16' at scale), the loss correcting for it
  # (behaviour_correction 'tis' / 'mask' / 'none', bound tis_cap);
  # sampler_layout: that copy's layout on a mesh ('inference': no FSDP,
  # experts over the FSDP and expert axes; 'train': the learner's);
  # sampler_weight_layout: how that copy lays out each weight in memory
  # ('auto': on TPU the attention's input projections with the embed axis
  # minor, as its decode matmuls read them; elsewhere as the learner holds
  # them; 'decode' / 'default' force either).
  # verifier_reward: 'graded' (the verifier's reward; instruction following:
  # the fraction of constraints met) or 'passed' (1 / 0: all met, the
  # paper's IF-RL reward). max_staleness: step t's rollouts sampled by the
  # policy of t - max_staleness updates (0: strictly on-policy), trained
  # with the decoupled objective; rollout_worker 'thread' samples them in a
  # thread of the learner's process while the learner updates, 'process'
  # in a process of its own (rollout_cpus: its cores; on several hosts one
  # a host, their own jax.distributed run at rollout_coordinator, '': the
  # learner's coordinator port + 1; rollout_env: its environment, e.g.
  # 'CUDA_VISIBLE_DEVICES=4,5,6,7'), 'inline' when a step asks; rollout_devices: the sampler's own devices (the run's last n, on
  # a mesh of rollout_mesh's shape, e.g. 'data=2,expert=2', '': data=-1,
  # or a sampler process's, '': the stage's mesh; 0: the
  # learner's; inline or thread). capacity_headroom: the
  # stage's first update sizes the learner's MoE capacity for that much
  # more load than its batch needs (each larger capacity compiles again).
  # sample_slots: continuous batching of a single-turn step's rollouts, that
  # many rows at a time, a key a rollout (0: one fixed batch; one device);
  # prefill_rows: the most of them one prefill takes (0: all free ones; a
  # pod's first fill of every slot can outgrow the decode's memory).
  # episode_slots: the same for an episode stage's episodes, each row on its
  # own turn, a key an episode (prefill_rows bounds its prefills of new
  # episodes too).
  c.rl = ml_collections.ConfigDict(dict(
      algorithm='grpo', prompts_per_step=16, rollouts_per_prompt=8,
      temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16, kl_coef=0.0,
      clip_eps_low=0.2, clip_eps_high=0.2, updates_per_batch=1, micro_batches=1,
      advantage_scale='std', dynamic_filtering=True, max_refill_rounds=2,
      overlong='penalty', routing_replay=True, mopd_reward_weight=0.0,
      trim_bucket=0, pack_width=0, capacity_headroom=0.25, sampler_dtype='float32',
      sampler_layout='inference', sampler_weight_layout='auto',
      behaviour_correction='tis', tis_cap=2.0,
      verifier_reward='graded', max_staleness=0, rollout_worker='inline',
      rollout_cpus='', rollout_coordinator='', rollout_env='',
      rollout_devices=0,
      rollout_mesh='',
      sample_slots=0, prefill_rows=0, episode_slots=0))
  c.optim = ml_collections.ConfigDict(dict(
      lr=2e-4, warmup_steps=10, decay_steps=1000, end_lr_frac=1.0, b1=0.9,
      b2=0.95, weight_decay=0.0, clip_norm=1.0, schedule='constant',
      warmup_init_frac=0.1, moment_dtype='float32'))
  c.teachers = ml_collections.ConfigDict({'math': ''})  # MOPD: domain -> run
  # A reward-model run (Bradley-Terry) or a generative judge's run
  # (configs/judge.py): its scores are the reward instead of the verifiers'.
  c.reward_model = ''
  # The judge's comparisons: each rollout against the others of its group
  # ('group') or the record's reference reply ('reference'), both orders;
  # length_penalty > 0 pays less for a reply longer than its group's mean.
  c.judge = ml_collections.ConfigDict(dict(compare='group',
                                           length_penalty=0.0))
  c.steps = 100
  c.log_every = 10
  c.eval_every = 25
  c.eval_n = 256                     # 0: no evaluation in the stage
  # Greedy (0.0) or pass@1 at a temperature, the mean over eval_samples
  # samples a prompt (as the cascade scores its stages).
  c.eval_temperature = 0.0
  c.eval_samples = 1
  c.checkpoint_every = 25
  c.keep_checkpoints = 2
  if arg == 'mopd':
    c.rl.algorithm = 'mopd'
    c.rl.rollouts_per_prompt = 4
    c.rl.dynamic_filtering = False
  elif arg == 'quick':
    c.rl.prompts_per_step, c.rl.rollouts_per_prompt = 4, 4
    c.steps, c.eval_every, c.eval_n, c.checkpoint_every = 4, 0, 8, 2
    c.data.n_train = 64
  elif arg:
    raise ValueError(f'configs/rl.py: unknown argument {arg!r}')
  return c


def sweep():
  for lr in (1e-4, 2e-4, 3e-4):
    yield {'config.optim.lr': lr}
