"""How dropless (`ragged`) expert parallelism moves tokens to their experts' shards.

`expert_exchange` implementations:
- 'all_gather' (the reference; CPU's): every shard all-gathers the tokens of
  its expert group, computes its own experts' share of every token and the
  shares are reduce-scattered back. Works on every backend; moves ep x the
  tokens.
- 'ragged_all_to_all' (GPU, TPU; MaxText's): each shard sends every
  (token, choice) pair to the one shard that holds its expert and gets the
  result back, `jax.lax.ragged_all_to_all` both ways (XLA:CPU does not
  implement it).
- 'ragged_all_to_all_emulated': the same dispatch with the collective
  emulated by an all-gather: how the CPU tests check the GPU / TPU path's
  offsets and sorting.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from cascade_jax.ops import _registry


def expert_exchange(dtype=None) -> str:
  """The exchange the `ragged` dispatch uses under expert parallelism, recorded."""
  backend = _registry.backend()
  native = backend in ('gpu', 'tpu') or _registry.elsewhere(
      f'XLA:{backend.upper()} has no ragged_all_to_all')
  return _registry.pick('expert_exchange', [
      ('ragged_all_to_all', native), ('all_gather', True),
      ('ragged_all_to_all_emulated', True)], dtype=dtype)


def axis_index(axes) -> jax.Array:
  """Linear index of this shard over `axes` (row-major, as collectives use)."""
  idx = jnp.zeros((), jnp.int32)
  for a in axes:
    idx = idx * jax.lax.axis_size(a) + jax.lax.axis_index(a)
  return idx


def ragged_all_to_all(operand, output, input_offsets, send_sizes,
                      output_offsets, recv_sizes, *, axes: tuple[str, ...],
                      emulated: bool):
  """`jax.lax.ragged_all_to_all` over `axes`, or its all-gather emulation.

  Sender i's rows input_offsets[j] : + send_sizes[j] land on shard j at
  output_offsets[j]; everything else in `output` is kept.
  """
  axis = axes if len(axes) > 1 else axes[0]
  if not emulated:
    return jax.lax.ragged_all_to_all(operand, output, input_offsets,
                                     send_sizes, output_offsets, recv_sizes,
                                     axis_name=axis)
  del recv_sizes  # implied by the senders' sizes
  ep = math.prod(jax.lax.axis_size(a) for a in axes)
  me = axis_index(axes)
  gather = lambda v: jax.lax.all_gather(v, axis, axis=0, tiled=False)
  all_x, all_in, all_n, all_out = map(
      gather, (operand, input_offsets, send_sizes, output_offsets))
  rows = jnp.arange(output.shape[0])
  for i in range(ep):
    start, n, src0 = all_out[i, me], all_n[i, me], all_in[i, me]
    take = (rows >= start) & (rows < start + n)
    src = jnp.clip(rows - start + src0, 0, operand.shape[0] - 1)
    output = jnp.where(take.reshape((-1,) + (1,) * (output.ndim - 1)),
                       all_x[i][src], output)
  return output
