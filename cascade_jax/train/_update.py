"""What every learner's update shares: gradients accumulated over micro-batches, and one optimizer tail.

A learner's step is `accumulate_gradients` (the loss's gradient over the
whole batch, computed k micro-batches at a time) followed by
`apply_gradients` (the optimizer's update, applied). SFT, GRPO / MOPD, the
reward model and the judge all take their steps this way.

Micro-batches are strided: micro-batch i holds rows i, i + k, i + 2k, ...
A batch sharded over devices by rows (contiguous blocks) then keeps every
micro-batch spread over every device, with no data moving between them;
`micro_batch_rows` gives the same split on the host (for shapes, such as an
MoE capacity, that must fit every micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cascade_jax.train._state import TrainState

# loss_fn(params, micro_batch) -> (loss, metrics dict)
LossFn = Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]]


def check_micro_batches(rows: int, micro_batches: int, *, what: str = 'batch',
                        multiple: int = 1) -> None:
  """A clear error unless `micro_batches` splits `rows` into equal parts
  (each a multiple of `multiple`, e.g. the devices a batch is split over)."""
  if micro_batches < 1:
    raise ValueError(f'micro_batches must be >= 1, got {micro_batches}')
  if rows % micro_batches or (rows // micro_batches) % multiple:
    raise ValueError(
        f'micro_batches={micro_batches} must split the {what}\'s {rows} rows '
        f'into equal micro-batches' + (
            f' of a multiple of {multiple} rows (the devices the batch is '
            'split over)' if multiple > 1 else ''))


def micro_batch_rows(rows: int, micro_batches: int) -> list[np.ndarray]:
  """The rows of each micro-batch (host side): i, i + k, i + 2k, ..."""
  check_micro_batches(rows, micro_batches)
  return [np.arange(i, rows, micro_batches) for i in range(micro_batches)]


def split_micro_batches(batch, micro_batches: int):
  """[B, ...] leaves -> [k, B / k, ...], micro-batch i holding rows i + j k."""
  def split(x):
    x = x.reshape(x.shape[0] // micro_batches, micro_batches, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def accumulate_gradients(loss_fn: LossFn, params, batch, micro_batches: int,
                         *, maxima: Collection[str] = ()):
  """(loss, metrics, grads) of `loss_fn` summed over `micro_batches` parts.

  The loss of the whole batch must be the sum of its micro-batches' losses:
  a token-level loss divides each micro-batch's sum by the whole batch's
  token count (not its own), which `loss_fn` closes over. Then
  `micro_batches` changes only the order of float sums, not the objective.
  Metrics are summed likewise (a mean metric must be normalised by the
  whole batch's count), except those named in `maxima` or ending in `_max`,
  which take the maximum. With one micro-batch this is `value_and_grad`
  itself: no loop, no accumulator.

  The micro-batches run in a `lax.scan` whose carry is the accumulated
  gradients: one micro-batch's activations live at a time.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_batches == 1:
    (loss, metrics), grads = grad_fn(params, batch)
    return loss, metrics, grads
  rows = jax.tree.leaves(batch)[0].shape[0]
  check_micro_batches(rows, micro_batches)
  is_max = lambda k: k in maxima or k.endswith('_max')

  def add(acc, new):
    loss_a, m_a, g_a = acc
    loss_n, m_n, g_n = new
    m = {k: (jnp.maximum if is_max(k) else jnp.add)(m_a[k], m_n[k])
         for k in m_a}
    return loss_a + loss_n, m, jax.tree.map(jnp.add, g_a, g_n)

  def body(acc, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    return add(acc, (loss, metrics, grads)), None

  micro = split_micro_batches(batch, micro_batches)
  first = jax.tree.map(lambda x: x[0], micro)
  shapes = jax.eval_shape(lambda p, b: grad_fn(p, b), params, first)
  (loss_s, metrics_s), grads_s = shapes
  zeros = lambda s: jnp.zeros(s.shape, s.dtype)
  init = (zeros(loss_s),
          {k: (jnp.full(v.shape, -jnp.inf, v.dtype) if is_max(k) else zeros(v))
           for k, v in metrics_s.items()},
          jax.tree.map(zeros, grads_s))
  (loss, metrics, grads), _ = jax.lax.scan(body, init, micro)
  return loss, metrics, grads


def apply_gradients(state: TrainState, grads, opt: optax.GradientTransformation
                    ) -> tuple[TrainState, jax.Array]:
  """The optimizer tail every learner shares: (next state, gradient norm).

  `opt` (clipping, AdamW, schedule: `make_optimizer`) turns the gradients
  into updates, which are added to the parameters; the step counts up.
  Non-parameter variables (`state.rest`) are left as they are.
  """
  updates, opt_state = opt.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return (TrainState(params, state.rest, opt_state, state.step + 1),
          optax.global_norm(grads))
