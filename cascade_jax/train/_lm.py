"""Language-model quantities from logits: token log-probs, masked cross-entropy, entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax.ops import token_logprobs


def token_entropy(logits_btv: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def masked_nll_sum(logits_btv, targets_bt, mask_bt):
  """(sum of -log p over masked tokens, number of masked tokens)."""
  m = mask_bt.astype(jnp.float32)
  return -jnp.sum(token_logprobs(logits_btv, targets_bt) * m), jnp.sum(m)
