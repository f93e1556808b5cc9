"""Language-model quantities from the output head: token log-probs, masked cross-entropy, entropy.

The losses take the final hidden states, not logits: `token_stats` applies
the output head `chunk` positions at a time under `jax.checkpoint`, so that
with a chunk no full [B, T, V] fp32 tensor exists, forward or backward (at a
131k vocabulary and 8k positions that tensor is 4 GB per sequence, twice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

from cascade_jax.ops import token_logprobs


def token_entropy(logits_btv: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


# logits [B, c, V] fp32 and the chunk's slice of `aux` -> processed logits.
Process = Callable[[jax.Array, Mapping[str, jax.Array]], jax.Array]


def token_stats(head: Callable[[jax.Array], jax.Array], hidden_btd: jax.Array,
                targets_bt: jax.Array, *, chunk: int = 0,
                process: Process | None = None,
                aux: Mapping[str, jax.Array] | None = None,
                entropy: bool = False):
  """(log p(target) [B, T], entropy [B, T] or None) from hidden states.

  Args:
    head: hidden [B, c, D] -> logits [B, c, V] fp32 (`Transformer.logits`).
    hidden_btd: the model's final normed hidden states.
    targets_bt: the token whose log-prob is taken at each position.
    chunk: positions per head application (0: all at once). The sequence is
      padded to a multiple; each chunk's logits are recomputed in the
      backward pass rather than kept.
    process: applied to each chunk's logits before the softmax (temperature,
      top-k / top-p), with `aux` ([B, T] arrays) sliced to the chunk.
    entropy: also return the entropy of each position's distribution.
  """
  aux = dict(aux or {})

  def stats(h, tg, ax):
    logits = head(h)
    if process is not None:
      logits = process(logits, ax)
    lp = token_logprobs(logits, tg)
    return lp, (token_entropy(logits) if entropy else jnp.zeros_like(lp))

  b, t, _ = hidden_btd.shape
  if not chunk or chunk >= t:
    lp, ent = stats(hidden_btd, targets_bt, aux)
    return lp, (ent if entropy else None)
  n = -(-t // chunk)
  pad = n * chunk - t

  def split(x):  # [B, T, ...] -> [n, B, chunk, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)

  lp, ent = jax.lax.map(
      lambda xs: jax.checkpoint(stats)(*xs),
      (split(hidden_btd), split(targets_bt), {k: split(v)
                                              for k, v in aux.items()}))
  join = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, n * chunk)[:, :t]
  return join(lp), (join(ent) if entropy else None)
