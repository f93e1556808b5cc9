"""`RLConfig`: one RL stage's algorithm, sampling and batch settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp

from cascade_jax import domains
from cascade_jax import rollout
from cascade_jax import sharding


SAMPLER_DTYPES = ('float32', 'bfloat16')
CORRECTIONS = ('tis', 'mask', 'none')
SAMPLER_LAYOUTS = ('inference', 'train')
SAMPLER_WEIGHT_LAYOUTS = ('auto', 'decode', 'default')
ROLLOUT_WORKERS = ('inline', 'thread', 'process')


VERIFIER_REWARDS = ('graded', 'passed')


@dataclasses.dataclass(frozen=True)
class RLConfig:
  algorithm: str = 'grpo'           # 'grpo' | 'mopd'
  prompts_per_step: int = 16
  rollouts_per_prompt: int = 8
  temperature: float = 1.0
  # The learner scores a token under the distribution it was drawn from:
  # softmax(logits / temperature), renormalised over the top-k / top-p set.
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 48
  kl_coef: float = 0.0
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  # Optimizer steps per batch, each on its own minibatch of whole groups
  # (1: the recipe's, strictly on-policy; more: PPO-style, clipped against
  # the sampler's log-probs).
  updates_per_batch: int = 1
  # Each optimizer step's gradient computed in this many micro-batches
  # (accumulated; the objective is the same for any count): the recipe's
  # batch of 128 x 16 rollouts of up to 8k tokens is one update on any mesh.
  micro_batches: int = 1
  advantage_scale: str = 'std'      # 'std' | 'none'
  dynamic_filtering: bool = True
  max_refill_rounds: int = 2
  # A response cut at max_new_tokens: 'penalty' (a verifier's reward 0; a
  # reward model's score replaced by the lowest of its group), 'filter'
  # (out of the loss: no gradient), or 'none' (scored as it is).
  overlong: str = 'penalty'
  routing_replay: bool = True
  mopd_reward_weight: float = 0.0
  # A verifier's reward: 'graded' (its reward: instruction following's is
  # the fraction of constraints met) or 'passed' (1 when the response
  # passes whole, else 0: all constraints met, the paper's IF-RL reward).
  verifier_reward: str = 'graded'
  # Cut the batch's empty response tail in buckets of this many tokens
  # (0: never). Each new width compiles the update once more: worth it for
  # long stages with a generous max_new_tokens, not for 30-step ones.
  trim_bucket: int = 0
  # Pack the learner's rollouts into rows of this many positions, several
  # a row (`rl.pack`; 0: a row each). Episode batches are mostly padding
  # (multi-domain RL's were 35-54 % full, SWE-agent's 51-72 %): packed, the
  # update runs over the tokens, and its row count takes few sizes (one
  # compile each) where trimmed widths took many. GRPO with one update a
  # batch (a token-level loss: where a token sits does not change it).
  pack_width: int = 0
  # A packed batch's rows: at least this many, at most its rollouts (0: the
  # first batch's need with `capacity_headroom`). A stage whose episodes
  # lengthen as it learns grows its rows step by step, one compile of the
  # update each (the main job's SWE-agent RL: 40, 48, 56, 64); starting at
  # the largest compiles once, and pays for the larger rows at every step
  # (there the two cancelled: docs/results/archive/main_job_refill_shapes_2026-12-05).
  pack_rows: int = 0
  # The MoE capacity of the stage's first update (the capacity path under
  # replayed routing, `model.exact_dispatch`) fits this much more load than
  # its batch needs. A run never lowers its capacity and its later batches'
  # loads drift upwards as the policy moves, so without headroom nearly
  # every stage compiled its update twice at one batch shape; each compile
  # of the main job's update costs 2-3 s on a laptop CPU. 0: exactly what
  # the first batch needs. A packed batch's row count (`pack_width`) is
  # sized the same way, for the same reason.
  capacity_headroom: float = 0.25
  # Multi-turn domains (an environment per record; `max_new_tokens` is then
  # a reply's budget): turns, tokens of one observation, tokens of the
  # whole episode (prompt included; the learner's sequence length). 0: the
  # largest default of the stage's domains (`Domain.episode_limits`).
  max_turns: int = 0
  max_observation_tokens: int = 0
  max_episode_tokens: int = 0
  # The sampler's copy of the policy's weights, made from the learner's by
  # one jitted cast after each update (the weight sync, `SamplerWeights`)
  # where they are wider: 'float32' (the main job: the learner's own, read
  # directly, so sampling stays exactly on-policy) or 'bfloat16' (at
  # scale: half the bytes).
  sampler_dtype: str = 'float32'
  # On a mesh, the sampler's copy in its own layout: 'inference' (no FSDP
  # on weights, experts split over the FSDP and expert axes:
  # `sharding.inference_rules`; decode moves tokens to experts, never
  # weights) or 'train' (the learner's layout, read as it is). One jitted
  # reshard after each update; off a mesh nothing changes.
  sampler_layout: str = 'inference'
  # The sampler's copy in memory: 'decode' writes the attention's input
  # projections with their embed axis minor (what the decode step's
  # matmuls read on TPU; in the learner's layout XLA re-lays them out every
  # step), 'default' as the learner holds them, 'auto' 'decode' on TPU and
  # 'default' elsewhere (`rl.resolve_weight_layout`). 'decode' makes a copy
  # even where dtype and placement match the learner's.
  sampler_weight_layout: str = 'auto'
  # A sampler that differs from the learner (sampler_dtype not the
  # learner's) is corrected in GRPO's loss: 'tis' weighs each token by
  # min(pi_learner / pi_sampler, tis_cap) (truncated importance sampling),
  # 'mask' drops the tokens whose ratio is outside [1 / tis_cap, tis_cap],
  # 'none' trains as if on-policy. Nothing is applied when the sampler is
  # the learner and both compute in fp32 (`correction`). (MOPD's loss
  # always weighs by that ratio, truncated.)
  behaviour_correction: str = 'tis'
  tis_cap: float = 2.0
  # Decoupled rollouts (`rl._decoupled`): step t's rollouts are sampled by
  # the policy of max(t - max_staleness, 0) updates, so a sampler can
  # generate the next steps' while the learner updates (0: the paper's
  # strict on-policy loop). Stale rollouts are trained with the decoupled
  # objective: the sampler's log-probs are the behaviour policy (weighed by
  # `behaviour_correction`, capped at `tis_cap`), the current policy the
  # proximal one the clipped ratio is taken against.
  max_staleness: int = 0
  # Where rollouts are collected (sampled, scored, filtered): 'inline' (the
  # learner's process, when a step asks), 'thread' (a sampler thread of the
  # learner's process, `max_staleness` steps ahead: its device work and
  # host work (rewards, sandbox runs) overlap the learner's update) or
  # 'process' (a sampler process of its own, as far ahead, the weights sent
  # through host memory after each update). `rollout_cpus`: the CPU cores
  # that process is pinned to ('1' or '2,3'; '': any). On a run of several
  # processes each learner process starts a sampler process on its host,
  # and the samplers form a jax.distributed run of their own, coordinated
  # at `rollout_coordinator` ('host:port'; '': the learner's coordinator's
  # host, its port + 1), on a mesh of their own (`rollout_mesh`); each
  # learner process sends its own sampler its own shards of the weights,
  # from which it cuts its blocks. `rollout_env`:
  # environment variables the sampler process starts with, set before its
  # XLA starts ('CUDA_VISIBLE_DEVICES=4,5,6,7;XLA_PYTHON_CLIENT_PREALLOCATE=
  # false'): its own accelerators, where the learner's process was started
  # with the others.
  rollout_worker: str = 'inline'
  rollout_cpus: str = ''
  rollout_coordinator: str = ''
  rollout_env: str = ''
  # The sampler's own devices ('inline' and 'thread'): the last
  # `rollout_devices` of the run's, on a mesh of `rollout_mesh`'s shape
  # ('data=2,expert=2': the stage mesh's axes, one of them may be -1; '':
  # 'data=-1'); the learner's mesh (`mesh`) takes the others, and the
  # weight sync copies the sampler's weights onto them device to device. 0:
  # the sampler runs on the learner's devices. A sampler process's mesh is
  # `rollout_mesh` too ('': the stage's `mesh`); on several hosts each
  # host's sampler devices must need only blocks of the weights its
  # learner process holds (a mirror of the learner's mesh does).
  rollout_devices: int = 0
  rollout_mesh: str = ''
  # Continuous batching (`rollout.generate_continuous`; on a mesh the rows
  # split over the batch axes, rounded up to a multiple of them): a
  # single-turn step's rollouts decode `sample_slots` rows at a time, a
  # row whose reply ends taking the next waiting prompt, each rollout with
  # a key of its own (`rollout.row_keys`: its tokens do not depend on the
  # rows beside it). 0: the step's rollouts in one fixed batch, decoded
  # until the longest reply ends. Episode stages: `episode_slots`.
  sample_slots: int = 0
  # With `sample_slots` or `episode_slots`: the most rows one prefill takes,
  # the first fill of every slot included (`generate_continuous` /
  # `run_episodes(prefill_rows=...)`: new episodes; observations go in in
  # place), rounded up to a multiple of the batch devices; 0: every free
  # row at once. On a pod the first fill's activations (rows x prompt
  # tokens) can need far more memory than the decode loop: the 30B plan's
  # 32 rows a chip prefill at 60 GB, decode at 37
  # (docs/results/archive/plan_prefill_rows_2026-12-07).
  prefill_rows: int = 0
  # Continuous batching of a step's episodes (`run_episodes(slots=...)`,
  # on a mesh as `sample_slots`): `episode_slots` episodes play at a time,
  # each row on its own turn (a reply that ends steps its environment and
  # takes its observation while the other rows sample), a finished
  # episode's row taking the next waiting one; an episode a key
  # (`rollout.turn_keys`). 0: the step's episodes in one fixed batch, each
  # turn until its longest reply ends, the batch until its longest episode
  # ends.
  episode_slots: int = 0

  def episode_config(self, domain_names: Sequence[str]
                     ) -> rollout.EpisodeConfig:
    """Episode limits for a stage over `domain_names` (see max_turns)."""
    limits = [domains.get(d).episode_limits for d in domain_names]
    pick = lambda k, v: v or max(int(x.get(k, 1)) for x in limits)
    return rollout.EpisodeConfig(
        max_turns=pick('max_turns', self.max_turns),
        max_new_tokens=self.max_new_tokens,
        max_observation_tokens=pick('max_observation_tokens',
                                    self.max_observation_tokens),
        max_tokens=pick('max_tokens', self.max_episode_tokens))

  def correction(self, learner_dtype, compute_dtype='float32') -> str:
    """The behaviour correction the loss applies when the learner's
    weights are `learner_dtype` and the model computes in `compute_dtype`:
    'none' only when the sampler reads the weights as they are, computes
    in fp32 and is never behind (`max_staleness` 0). Below fp32 the
    sampler's programs (attention over the cache, one token a step) and
    the learner's (fused attention over the sequence) round differently:
    on an H200 in bf16, mean |d log p| 0.0075 on identical weights
    (docs/results/gpu/h200_2026-12-04), which the loss then corrects."""
    exact = (jnp.dtype(self.sampler_dtype).itemsize >=
             jnp.dtype(learner_dtype).itemsize and
             jnp.dtype(compute_dtype).itemsize >= 4 and not self.max_staleness)
    return 'none' if exact else self.behaviour_correction

  def _check_rollout_worker(self):
    """`rollout_worker`, `rollout_cpus`, `rollout_devices`, `rollout_mesh`."""
    if self.rollout_worker not in ROLLOUT_WORKERS:
      raise ValueError(f'rl.rollout_worker: {self.rollout_worker!r} not in '
                       f'{ROLLOUT_WORKERS}')
    if self.rollout_cpu_list() and self.rollout_worker != 'process':
      raise ValueError("rl.rollout_cpus pins the sampler process: it needs "
                       "rl.rollout_worker='process'")
    if self.rollout_devices < 0:
      raise ValueError(f'rl.rollout_devices must be >= 0 (0: the learner\'s '
                       f'devices), got {self.rollout_devices}')
    if self.rollout_devices and self.rollout_worker == 'process':
      raise ValueError(
          "rl.rollout_devices splits this process's devices between the "
          "learner and the sampler: it needs rl.rollout_worker 'thread' or "
          "'inline' (a sampler process sees the devices its environment "
          'gives it: rl.rollout_env)')
    self.rollout_mesh_shape()   # a malformed shape is named now
    if self.rollout_env_vars() and self.rollout_worker != 'process':
      raise ValueError("rl.rollout_env is the sampler process's environment: "
                       "it needs rl.rollout_worker='process'")
    if self.rollout_coordinator and (
        self.rollout_worker != 'process' or
        not str(self.rollout_coordinator).rpartition(':')[2].isdigit()):
      raise ValueError(
          f'rl.rollout_coordinator: {self.rollout_coordinator!r}: the '
          "'host:port' of the sampler processes' own run, with "
          "rl.rollout_worker='process'")

  def rollout_cpu_list(self) -> tuple[int, ...]:
    """`rollout_cpus` as core numbers: '2,3' -> (2, 3); '' -> ()."""
    try:
      cpus = tuple(int(c) for c in str(self.rollout_cpus).split(',')
                   if c.strip())
    except ValueError:
      cpus = (-1,)
    if any(c < 0 for c in cpus):
      raise ValueError(f'rl.rollout_cpus: {self.rollout_cpus!r} is not a '
                       "comma-separated list of CPU core numbers ('1', '2,3')")
    return cpus

  def rollout_env_vars(self) -> dict[str, str]:
    """`rollout_env` as a dict: 'A=1;B=x,y' -> {'A': '1', 'B': 'x,y'}."""
    out = {}
    for item in str(self.rollout_env).split(';'):
      if not item.strip():
        continue
      key, eq, value = item.partition('=')
      if not eq or not key.strip().isidentifier():
        raise ValueError(
            f'rl.rollout_env: {item!r} in {self.rollout_env!r} is not '
            "KEY=VALUE (items separated by ';', e.g. "
            "'CUDA_VISIBLE_DEVICES=4,5,6,7')")
      out[key.strip()] = value
    return out

  def rollout_mesh_shape(self, default=None) -> dict[str, int] | None:
    """`rollout_mesh` as a mesh shape: 'data=2,expert=2' -> {'data': 2,
    'expert': 2}; '' -> `default`."""
    if not str(self.rollout_mesh).strip():
      return default
    shape = {}
    for part in str(self.rollout_mesh).split(','):
      axis, _, size = (x.strip() for x in part.partition('='))
      if axis in shape:
        raise ValueError(f'rl.rollout_mesh: {self.rollout_mesh!r} names '
                         f'{axis!r} twice')
      try:
        shape[axis] = int(size)
      except ValueError:
        shape[axis] = 0
      if not shape[axis] or axis not in sharding.MESH_AXES:
        raise ValueError(
            f'rl.rollout_mesh: {self.rollout_mesh!r} is not a mesh shape '
            f"such as 'data=-1' or 'data=2,expert=2' (axes "
            f'{sharding.MESH_AXES}, one size -1)')
    return shape

  @property
  def sample_config(self) -> rollout.SampleConfig:
    return rollout.SampleConfig(max_new_tokens=self.max_new_tokens,
                                temperature=self.temperature,
                                top_p=self.top_p, top_k=self.top_k)

  def __post_init__(self):
    if self.algorithm not in ('grpo', 'mopd'):
      raise ValueError(f"rl.algorithm must be 'grpo' or 'mopd', got "
                       f'{self.algorithm!r}')
    if self.overlong not in ('penalty', 'filter', 'none'):
      raise ValueError(f'rl.overlong: {self.overlong!r} not in '
                       "('penalty', 'filter', 'none')")
    if self.verifier_reward not in VERIFIER_REWARDS:
      raise ValueError(f'rl.verifier_reward: {self.verifier_reward!r} not in '
                       f'{VERIFIER_REWARDS}')
    if not self.temperature > 0:
      raise ValueError(
          f'rl.temperature must be > 0, got {self.temperature}: the learner '
          'trains on sampled rollouts and scores them under softmax(logits / '
          'temperature); greedy decoding (0) is for evaluation only')
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f'rl.top_p must be in (0, 1], got {self.top_p}')
    if self.top_k < 0:
      raise ValueError(f'rl.top_k must be >= 0 (0: off), got {self.top_k}')
    if self.sampler_dtype not in SAMPLER_DTYPES:
      raise ValueError(f'rl.sampler_dtype: {self.sampler_dtype!r} not in '
                       f'{SAMPLER_DTYPES}')
    if self.sampler_layout not in SAMPLER_LAYOUTS:
      raise ValueError(f'rl.sampler_layout: {self.sampler_layout!r} not in '
                       f'{SAMPLER_LAYOUTS}')
    if self.sampler_weight_layout not in SAMPLER_WEIGHT_LAYOUTS:
      raise ValueError(f'rl.sampler_weight_layout: '
                       f'{self.sampler_weight_layout!r} not in '
                       f'{SAMPLER_WEIGHT_LAYOUTS}')
    if self.behaviour_correction not in CORRECTIONS:
      raise ValueError(f'rl.behaviour_correction: '
                       f'{self.behaviour_correction!r} not in {CORRECTIONS}')
    if self.max_staleness < 0:
      raise ValueError(f'rl.max_staleness must be >= 0, got '
                       f'{self.max_staleness}')
    if self.sample_slots < 0:
      raise ValueError(f'rl.sample_slots must be >= 0 (0: one fixed batch), '
                       f'got {self.sample_slots}')
    if self.prefill_rows < 0:
      raise ValueError(f'rl.prefill_rows must be >= 0 (0: every free row at '
                       f'once), got {self.prefill_rows}')
    if self.episode_slots < 0:
      raise ValueError(f'rl.episode_slots must be >= 0 (0: one fixed batch), '
                       f'got {self.episode_slots}')
    self._check_rollout_worker()
    if not self.capacity_headroom >= 0.0:
      raise ValueError(f'rl.capacity_headroom must be >= 0 (0: the first '
                       f'batch\'s own load), got {self.capacity_headroom}')
    if not self.tis_cap >= 1.0:
      raise ValueError(f'rl.tis_cap must be >= 1, got {self.tis_cap}')
    if self.pack_width < 0:
      raise ValueError(f'rl.pack_width must be >= 0 (0: no packing), got '
                       f'{self.pack_width}')
    if self.pack_rows < 0 or (self.pack_rows and not self.pack_width):
      raise ValueError(f'rl.pack_rows={self.pack_rows}: a packed batch\'s '
                       'least row count, >= 0, and only with rl.pack_width '
                       f'(got pack_width={self.pack_width})')
    if self.pack_width and (self.algorithm != 'grpo' or
                            self.updates_per_batch != 1):
      raise ValueError(
          'rl.pack_width packs rollouts of several groups into one row: it '
          'needs GRPO (MOPD normalises per sequence and asks each row\'s '
          f'teacher) with updates_per_batch=1 (got {self.algorithm!r}, '
          f'{self.updates_per_batch}: minibatches split whole groups)')
    for k in ('updates_per_batch', 'micro_batches'):
      if getattr(self, k) < 1:
        raise ValueError(f'rl.{k} must be >= 1, got {getattr(self, k)}')
    if self.rollouts_per_prompt < 2 and self.algorithm == 'grpo':
      raise ValueError('rl.rollouts_per_prompt must be >= 2 for GRPO '
                       '(advantages compare rollouts of one prompt)')
