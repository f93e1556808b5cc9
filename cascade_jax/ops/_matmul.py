"""Grouped matmul (`ragged_dot`): rows sorted by group, each group times its own matrix.

Implementations:
- 'xla': `jax.lax.ragged_dot`. On CPU the reference (XLA lowers it
  to a loop over groups there); on GPU / TPU XLA lowers it to a masked dense
  product, [M, G, N] in memory, which ran out of memory at a Qwen3-sized
  layer.
- 'tokamax': `tokamax.ragged_dot`, its Pallas kernels (Mosaic on TPU and
  Hopper, Triton elsewhere on GPU), as MaxText's dropless MoE uses on both;
  'auto' picks it on GPU / TPU whenever tokamax imports (on CPU it runs
  XLA's ragged_dot; forced there, the tests check the call through it).
  On GPU only a tokamax with `zero_initialize` (>= 0.0.17): without it the
  rows past the groups are left as memory was, which gave NaN expert
  gradients on an H200 for a batch with padding tokens.
Both take the same arguments and differentiate (tokamax has its own VJP
kernels). Callers size their row buffers with `round_rows` (rows past the
groups are zero), so that the kernel never refuses a shape; in strict mode
a count it would refuse is an error, not XLA's ragged_dot.
"""

from __future__ import annotations

import functools
import inspect

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


def tpu_tiles(m: int, k: int, n: int) -> tuple[int, int, int] | None:
  """(tile_m, tile_k, tile_n) for tokamax's TPU kernel on an [m, k] x [k, n]
  grouped matmul, or None (its own choice) unless every dimension is a
  multiple of 128.

  The kernel reads an expert's [tile_k, tile_n] blocks again for every
  tile_m rows and the rows again for every tile_n columns, and for shapes
  outside its tuned table it takes 128 x 128 x 128 tiles: at 30B a
  prefill's 262,144-row buffers read each expert's weights 2,048 times and
  the rows 6 times a matmul (docs/results/plan/prefill_tiles_2026-12-05).
  Here rows go 512 at a time and k and n whole up to 1,024 (else in 512 /
  1,024 blocks), as the table's entries for Qwen3's expert shapes do with
  rows 512 - 1,024: at most about 10 MB of VMEM, double-buffered. The
  backward's two kernels get the same rule over their own dimensions.
  """
  if m % 128 or k % 128 or n % 128:
    return None
  tm = next(t for t in (512, 256, 128) if m % t == 0)
  tk = k if k <= 1024 else next(t for t in (512, 256, 128) if k % t == 0)
  tn = n if n <= 1024 else next(t for t in (1024, 512, 256, 128)
                                 if n % t == 0)
  return tm, tk, tn


def _tpu_kernel(m: int, k: int, n: int):
  """tokamax's TPU kernel with `tpu_tiles`, or None where they do not apply
  (or this tokamax does not expose its config: its own choice then)."""
  tiles = tpu_tiles(m, k, n)
  if tiles is None:
    return None
  try:
    # pylint: disable=g-import-not-at-top
    from tokamax._src.ops.ragged_dot import base
    from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu as tpu
    # pylint: enable=g-import-not-at-top
    config = lambda t: tpu.Config(tile_m=t[0], tile_k=t[1], tile_n=t[2])
    # The backward's two kernels: d lhs [m, k] contracts n (its tiles: the
    # same rule with k and n swapped, in 128s whenever these are); d rhs
    # [g, k, n] contracts the rows.
    grads = functools.partial(
        base.vjp,
        dlhs_ragged_dot=tpu.PallasMosaicTpuRaggedDot(
            config=config(tpu_tiles(m, n, k))),
        drhs_ragged_dot=tpu.PallasMosaicTpuRaggedDot(config=config(tiles)))
    return tpu.PallasMosaicTpuRaggedDot(config=config(tiles), vjp=grads)
  except (ImportError, AttributeError, TypeError):
    return None


@functools.cache
def _zero_initializes() -> bool:
  """Whether tokamax's ragged_dot can zero the rows past the groups
  (`zero_initialize`, tokamax >= 0.0.17; older ones leave them as the
  kernel's memory was)."""
  tokamax = _attention.tokamax_module()
  return 'zero_initialize' in inspect.signature(tokamax.ragged_dot).parameters


def grouped_matmul(lhs_mk: jax.Array, rhs_gkn: jax.Array,
                   group_sizes_g: jax.Array, *,
                   preferred_element_type=None) -> jax.Array:
  """out[rows of group g] = lhs[rows of group g] @ rhs[g]: [M, K] x [G, K, N] -> [M, N].

  Rows past sum(group_sizes) are zero. group_sizes int32 [G].
  """
  backend = _registry.backend()
  accelerator, gpu = backend in ('gpu', 'tpu'), backend == 'gpu'
  tok = _attention.tokamax_available()
  m = lhs_mk.shape[0]
  if tok is True and gpu and not _zero_initializes():
    tok = ('this tokamax has no ragged_dot(zero_initialize=): its kernels '
           'leave the rows past the groups uninitialized, which gave NaN '
           'expert gradients on an H200 (pip install -U tokamax)')
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
    if _registry.backend() == 'tpu':
      impl = _tpu_kernel(lhs_mk.shape[0], lhs_mk.shape[1],
                         rhs_gkn.shape[2]) or impl
    # On GPU the rows past the groups zeroed, forward and in the VJP's
    # kernels (left uninitialized, they gave NaN gradients for batches with
    # padding on an H200). TPU's kernel: not seen on a TPU yet, unchanged.
    zero = dict(zero_initialize=True) if gpu else {}
    return tokamax.ragged_dot(lhs_mk, rhs_gkn, group_sizes_g,
                              preferred_element_type=preferred_element_type,
                              implementation=impl, **zero)
  return jax.lax.ragged_dot(lhs_mk, rhs_gkn, group_sizes_g,
                            preferred_element_type=preferred_element_type)
