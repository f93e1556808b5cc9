"""RLHF rewards: a Bradley-Terry reward model on the policy's backbone, or a generative pairwise judge.

`load(run_dir)` reads either kind of run (a judge's has judge.json) as the
learner's reward function: (records, responses) -> rewards [B].
"""

from cascade_jax.reward_model._model import accuracy
from cascade_jax.reward_model._model import encode_pairs
from cascade_jax.reward_model._model import RewardFunction
from cascade_jax.reward_model._model import RewardModel
from cascade_jax.reward_model._model import train_run
from cascade_jax.reward_model._judge import agreement as judge_agreement
from cascade_jax.reward_model._judge import is_judge
from cascade_jax.reward_model._judge import Judge
from cascade_jax.reward_model._judge import JudgeReward
from cascade_jax.reward_model._judge import train_run as judge_train_run
from cascade_jax.reward_model._model import load as _load_bradley_terry
from cascade_jax.reward_model._judge import load as _load_judge


def load(run_dir: str, *, setup=None, judge=None):
  """A reward-model or judge run as a reward function; `judge`: the judge's
  options (compare, length_penalty; see JudgeReward), ignored for a
  Bradley-Terry model."""
  if is_judge(run_dir):
    return _load_judge(run_dir, setup=setup, **dict(judge or {}))
  return _load_bradley_terry(run_dir, setup=setup)
