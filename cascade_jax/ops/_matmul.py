"""Grouped matmul (`ragged_dot`): rows sorted by group, each group times its own matrix.

Implementations:
- 'xla': `jax.lax.ragged_dot`. On CPU the reference (issue 2: XLA lowers it
  to a loop over groups there); on GPU / TPU XLA lowers it to a masked dense
  product, [M, G, N] in memory, which ran out of memory at a Qwen3-sized
  layer.
- 'tokamax': `tokamax.ragged_dot`, its Pallas kernels (Mosaic on TPU and
  Hopper, Triton elsewhere on GPU), as MaxText's dropless MoE uses on both;
  'auto' picks it on GPU / TPU whenever tokamax imports (on CPU it runs
  XLA's ragged_dot; forced there, the tests check the call through it).
Both take the same arguments and differentiate (tokamax has its own VJP
kernels). Callers size their row buffers with `round_rows` (rows past the
groups are zero), so that the kernel never refuses a shape; in strict mode
a count it would refuse is an error, not XLA's ragged_dot.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax.ops import _attention
from cascade_jax.ops import _registry


# tokamax's TPU kernel needs rows a multiple of its tile (128 by default,
# up to 1024 in its tuned table, which only holds shapes that are multiples
# of their tile); GPU kernels take any count. Buffers fed to it are sized in
# multiples of `row_tile()`.
ROW_TILE = 128


def row_tile() -> int:
  """Rows a grouped matmul's buffer should be a multiple of here (1 on CPU)."""
  return ROW_TILE if _registry.backend() in ('gpu', 'tpu') else 1


def round_rows(m: int) -> int:
  """`m` rounded up to `row_tile()`."""
  t = row_tile()
  return -(-m // t) * t


def grouped_matmul(lhs_mk: jax.Array, rhs_gkn: jax.Array,
                   group_sizes_g: jax.Array, *,
                   preferred_element_type=None) -> jax.Array:
  """out[rows of group g] = lhs[rows of group g] @ rhs[g]: [M, K] x [G, K, N] -> [M, N].

  Rows past sum(group_sizes) are zero. group_sizes int32 [G].
  """
  accelerator = _registry.backend() in ('gpu', 'tpu')
  tok = _attention._tokamax_available()  # pylint: disable=protected-access
  m = lhs_mk.shape[0]
  if tok is True and accelerator and m % ROW_TILE:
    tok = (f'{m} rows are not a multiple of the kernel\'s row tile '
           f'({ROW_TILE}; tokamax would run XLA\'s ragged_dot): size the '
           f'buffer with ops.row_tile()')
  candidates = [('tokamax', tok), ('xla', True)]
  if not accelerator:
    candidates.reverse()  # tokamax runs XLA's ragged_dot here: only if forced
  name = _registry.pick('grouped_matmul', candidates, dtype=lhs_mk.dtype,
                        shape=f'lhs {lhs_mk.shape}, rhs {rhs_gkn.shape}')
  group_sizes_g = group_sizes_g.astype(jnp.int32)
  if name == 'tokamax':
    tokamax = _attention.tokamax_module()
    # Strict: its Pallas kernel or an error (tokamax would otherwise take
    # XLA's ragged_dot on a shape its kernel refuses, silently).
    impl = 'mosaic' if accelerator and _registry.strict() else None
    return tokamax.ragged_dot(lhs_mk, rhs_gkn, group_sizes_g,
                              preferred_element_type=preferred_element_type,
                              implementation=impl)
  return jax.lax.ragged_dot(lhs_mk, rhs_gkn, group_sizes_g,
                            preferred_element_type=preferred_element_type)
