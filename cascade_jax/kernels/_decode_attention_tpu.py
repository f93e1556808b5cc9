"""Decode attention over a KV cache as one Pallas TPU kernel (online softmax in VMEM).

XLA:TPU runs a decode step's attention as two matmuls around a softmax, so
the fp32 scores [B, K, G, S] go to HBM and back between them (about 1.5 GB a
step for Qwen3-30B-A3B at 10k slots over 48 layers, beside the 8 GB of
cache it must read). Here each (row, kv head) streams its cache in blocks of
`block` slots through VMEM: q . k, the masked online softmax (a running
maximum, sum and weighted values) and p . v stay on chip, so the step reads
the cache once and writes only the output.

Only the blocks a row has written are read: the grid's slot axis runs over
the whole cache, but a block past the row's written length maps to the last
written one (so the pipeline does not fetch it again) and is skipped. Early
in a long generation a step reads a block or two, not the cache.

The cache layout is the sampler's (`ops.cache_attention`): keys [B, K, H, S]
(slot axis minor, so q . k is a plain [M, H] @ [H, block] matmul), values
[B, K, S, H]; queries [B, K, M, H], M = T * G (T new tokens, G query heads
per kv head); the mask [B, 1 or M, S] (int32; nonzero: the slot is seen).
Tested against the XLA formulation in Pallas' interpreter on the CPU; on a
TPU it is compiled (the plan), not yet executed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCKS = (512, 256, 128)   # slots a grid step reads, largest dividing S first
_NEG = -1e30               # finite: a row that sees no slot yields 0, not NaN
_LANES = 128


def block_for(slots: int) -> int | None:
  """The slot block for a cache of `slots`, or None if none divides it."""
  return next((b for b in BLOCKS if slots % b == 0), None)


def _kernel(blocks_ref, q_ref, k_ref, v_ref, m_ref, o_ref, top_ref, sum_ref,
            acc_ref, *, scale: float, n_blocks: int):
  row, s = pl.program_id(0), pl.program_id(2)

  @pl.when(s == 0)
  def _():
    top_ref[...] = jnp.full(top_ref.shape, _NEG, jnp.float32)
    sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when(s < blocks_ref[row])
  def _():
    q = q_ref[...]                                           # [M, H]
    logits = jnp.dot(q, k_ref[...],
                     preferred_element_type=jnp.float32) * scale  # [M, block]
    seen = jnp.broadcast_to(m_ref[...] != 0, logits.shape)
    logits = jnp.where(seen, logits, _NEG)
    top = top_ref[...][:, :1]                                # [M, 1]
    new_top = jnp.maximum(top, jnp.max(logits, axis=1, keepdims=True))
    p = jnp.where(seen, jnp.exp(logits - new_top), 0.0)
    fade = jnp.exp(top - new_top)
    total = sum_ref[...][:, :1] * fade + jnp.sum(p, axis=1, keepdims=True)
    pv = jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                 preferred_element_type=jnp.float32)         # [M, H]
    acc_ref[...] = acc_ref[...] * fade + pv
    top_ref[...] = jnp.broadcast_to(new_top, top_ref.shape)
    sum_ref[...] = jnp.broadcast_to(total, sum_ref.shape)

  @pl.when(s == n_blocks - 1)
  def _():
    total = sum_ref[...][:, :1]
    out = jnp.where(total > 0, acc_ref[...] / jnp.where(total > 0, total, 1.0),
                    0.0)
    o_ref[...] = out.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=('scale', 'block', 'interpret'))
def decode_attention(q_bkmh, keys_bkhs, values_bksh, mask_bms, written_b, *,
                     scale: float, block: int, interpret: bool = False):
  """Attention of M queries per (row, kv head) over the cache's written blocks.

  Args:
    q_bkmh: [B, K, M, H] queries (QK-norm and RoPE applied).
    keys_bkhs, values_bksh: the cache, the new keys / values already written.
    mask_bms: [B, 1, S] (every query sees the same slots) or [B, M, S], int32.
    written_b: [B] int32, slots written per row (the new ones included):
      blocks past it are neither read nor computed (the mask must hide
      every slot at or past it).
    scale: the logits' scale. block: slots a grid step reads (divides S).
    interpret: run in Pallas' interpreter (any backend; for tests).

  Returns:
    [B, K, M, H] in q's dtype (0 for a query that sees no slot).
  """
  b, kh, m, h = q_bkmh.shape
  s = keys_bkhs.shape[3]
  if s % block:
    raise ValueError(f'decode_attention: {s} slots are not a multiple of '
                     f'the block ({block})')
  n_blocks = s // block
  blocks = jnp.clip((written_b + block - 1) // block, 1, n_blocks).astype(
      jnp.int32)
  mrows = mask_bms.shape[1]

  def last_read(i, j, blocks_ref):
    return jnp.minimum(j, blocks_ref[i] - 1)

  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=(b, kh, n_blocks),
      in_specs=[
          pl.BlockSpec((None, None, m, h), lambda i, k, j, bl: (i, k, 0, 0)),
          pl.BlockSpec((None, None, h, block),
                       lambda i, k, j, bl: (i, k, 0, last_read(i, j, bl))),
          pl.BlockSpec((None, None, block, h),
                       lambda i, k, j, bl: (i, k, last_read(i, j, bl), 0)),
          pl.BlockSpec((None, mrows, block),
                       lambda i, k, j, bl: (i, 0, last_read(i, j, bl))),
      ],
      out_specs=pl.BlockSpec((None, None, m, h),
                             lambda i, k, j, bl: (i, k, 0, 0)),
      scratch_shapes=[pltpu.VMEM((m, _LANES), jnp.float32),
                      pltpu.VMEM((m, _LANES), jnp.float32),
                      pltpu.VMEM((m, h), jnp.float32)])
  item = lambda x: x.size * x.dtype.itemsize
  cost = pl.CostEstimate(
      flops=4 * b * kh * m * s * h, transcendentals=b * kh * m * s,
      bytes_accessed=(item(q_bkmh) * 2 + item(keys_bkhs) + item(values_bksh)
                      + item(mask_bms)))
  return pl.pallas_call(
      functools.partial(_kernel, scale=scale, n_blocks=n_blocks),
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct(q_bkmh.shape, q_bkmh.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'arbitrary')),
      cost_estimate=cost,
      interpret=interpret,
  )(blocks, q_bkmh, keys_bkhs, values_bksh, mask_bms)


__all__ = ['BLOCKS', 'block_for', 'decode_attention']
