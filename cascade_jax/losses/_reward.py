"""The Bradley-Terry pairwise loss for reward models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array


def bradley_terry_loss(scores_chosen: Array, scores_rejected: Array
                       ) -> tuple[Array, dict[str, Array]]:
  """Negative log-likelihood that each chosen response beats its rejected one.

      P(chosen > rejected) = sigmoid(r_c - r_r)
      loss = -mean_i log sigmoid(r_c,i - r_r,i)

  Args:
    scores_chosen, scores_rejected: Float[Array, 'b'] scalar rewards of the
      two responses of each pair.

  Returns:
    (loss, metrics) with accuracy (share of pairs ordered right) and the
    mean margin r_c - r_r.

  >>> loss, m = bradley_terry_loss(jnp.array([2.0, 0.0]), jnp.array([0.0, 0.0]))
  >>> round(float(loss), 4), float(m['accuracy'])   # (log(1+e^-2) + log 2) / 2
  (0.41, 0.5)
  """
  margin = (scores_chosen - scores_rejected).astype(jnp.float32)
  loss = -jnp.mean(jax.nn.log_sigmoid(margin))
  return loss, dict(accuracy=jnp.mean(margin > 0),
                    margin=jnp.mean(margin))
