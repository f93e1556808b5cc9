"""Log-softmax cross-entropy: each target token's log-probability under logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax.ops import _registry


def token_logprobs(logits_btv: jax.Array, targets_bt: jax.Array) -> jax.Array:
  """log p(target) per position, fp32: [..., V], [...] -> [...].

  One implementation today ('xla': log_softmax, then the target's entry),
  the one the sampler's log-probs are computed with, so that learner and
  sampler round alike. A head-fused, vocabulary-chunked version (no [T, V]
  logits in memory) belongs with the 30B memory work.
  """
  _registry.pick('token_logprobs', [('xla', True)], dtype=logits_btv.dtype)
  logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, targets_bt[..., None], axis=-1)[..., 0]
