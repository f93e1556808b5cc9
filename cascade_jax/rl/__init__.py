"""RL: collect rollouts (sample, reward, filter, refill) into an `RLBatch`; `Learner.step` updates on it.

  batch, stats = rl.collect(policy, tok, stream, cfg, key, reward_fn)
  state, metrics = learner.step(state, batch)

`rl.run` is one GRPO / MOPD stage: that loop with logging, checkpoints,
resume and evaluation.
"""

from cascade_jax.rl._batch import concatenate
from cascade_jax.rl._batch import from_episodes
from cascade_jax.rl._batch import from_rollout
from cascade_jax.rl._batch import RLBatch
from cascade_jax.rl._collect import collect
from cascade_jax.rl._collect import overlong_penalty
from cascade_jax.rl._collect import PromptStream
from cascade_jax.rl._collect import refill_size
from cascade_jax.rl._collect import RewardFn
from cascade_jax.rl._collect import shared_rewards
from cascade_jax.rl._collect import step_metrics
from cascade_jax.rl._collect import verifier_rewards
from cascade_jax.rl._config import RLConfig
from cascade_jax.rl._decoupled import InlineRollouts
from cascade_jax.rl._decoupled import policy_version
from cascade_jax.rl._decoupled import Rollout
from cascade_jax.rl._decoupled import split_devices
from cascade_jax.rl._decoupled import ThreadRollouts
from cascade_jax.rl._learner import check_on_policy
from cascade_jax.rl._learner import exact_moe
from cascade_jax.rl._learner import freeze
from cascade_jax.rl._learner import Frozen
from cascade_jax.rl._learner import frozen_logprobs
from cascade_jax.rl._learner import Learner
from cascade_jax.rl._learner import load_teachers
from cascade_jax.rl._learner import teacher_rows
from cascade_jax.rl._learner import update
from cascade_jax.rl._process import ProcessRollouts
from cascade_jax.rl._process import sampler_cluster
from cascade_jax.rl._sampler_side import domain_options
from cascade_jax.rl._shards import Shards
from cascade_jax.rl._stage import run
from cascade_jax.rl._sync import copies as sync_copies
from cascade_jax.rl._sync import embed_minor
from cascade_jax.rl._sync import inference_layout
from cascade_jax.rl._sync import resolve_weight_layout
from cascade_jax.rl._sync import sampler_ctx
from cascade_jax.rl._sync import sampler_state
from cascade_jax.rl._sync import sampler_tree
from cascade_jax.rl._sync import SamplerWeights
from cascade_jax.rl._sync import splits_always
from cascade_jax.rl._sync import sync_fn
from cascade_jax.rl._sync import weight_formats
