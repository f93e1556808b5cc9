"""The RL learner: rollouts, rewards, dynamic filtering, GRPO / MOPD updates."""

from cascade_jax.rl._batch import training_batch
from cascade_jax.rl._learner import check_on_policy
from cascade_jax.rl._learner import collect
from cascade_jax.rl._learner import exact_moe
from cascade_jax.rl._learner import overlong_penalty
from cascade_jax.rl._learner import refill_size
from cascade_jax.rl._learner import frozen_logprobs
from cascade_jax.rl._learner import PromptStream
from cascade_jax.rl._learner import RLConfig
from cascade_jax.rl._learner import trim_right
from cascade_jax.rl._learner import update
from cascade_jax.rl._learner import verifier_rewards
from cascade_jax.rl._stage import load_teachers
from cascade_jax.rl._stage import run
from cascade_jax.rl._stage import update_minibatches
