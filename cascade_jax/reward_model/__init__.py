"""Bradley-Terry reward model on the policy's backbone: the RLHF stage's reward."""

from cascade_jax.reward_model._model import accuracy
from cascade_jax.reward_model._model import encode_pairs
from cascade_jax.reward_model._model import load
from cascade_jax.reward_model._model import RewardFunction
from cascade_jax.reward_model._model import RewardModel
from cascade_jax.reward_model._model import train_run
