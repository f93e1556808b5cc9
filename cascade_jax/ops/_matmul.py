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
kernels).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax.ops import _attention
from cascade_jax.ops import _registry


def grouped_matmul(lhs_mk: jax.Array, rhs_gkn: jax.Array,
                   group_sizes_g: jax.Array, *,
                   preferred_element_type=None) -> jax.Array:
  """out[rows of group g] = lhs[rows of group g] @ rhs[g]: [M, K] x [G, K, N] -> [M, N].

  Rows past sum(group_sizes) are zero. group_sizes int32 [G].
  """
  tok = _attention._tokamax_available()  # pylint: disable=protected-access
  candidates = [('tokamax', tok), ('xla', True)]
  if _registry.backend() not in ('gpu', 'tpu'):
    candidates.reverse()  # tokamax runs XLA's ragged_dot here: only if forced
  name = _registry.pick('grouped_matmul', candidates, dtype=lhs_mk.dtype)
  group_sizes_g = group_sizes_g.astype(jnp.int32)
  if name == 'tokamax':
    tokamax = _attention.tokamax_module()
    return tokamax.ragged_dot(lhs_mk, rhs_gkn, group_sizes_g,
                              preferred_element_type=preferred_element_type)
  return jax.lax.ragged_dot(lhs_mk, rhs_gkn, group_sizes_g,
                            preferred_element_type=preferred_element_type)
