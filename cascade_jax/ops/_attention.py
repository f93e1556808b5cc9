"""Attention: over a sequence (training, scoring, prefill) and over a KV cache (decoding).

`attention` implementations:
- 'xla': two einsums around a masked fp32 softmax; the reference and the
  CPU default (and fp32 anywhere: the fused kernels are bf16 / fp16).
- 'cudnn': `jax.nn.dot_product_attention(implementation='cudnn')`, cuDNN's
  fused flash attention (GPU, bf16 / fp16, head_dim a multiple of 8 up to
  128), with the packed-segment mask passed as a mask (cuDNN adds it as a
  bias) and GQA native.
- 'tokamax': `tokamax.dot_product_attention` (its Pallas / Triton kernels
  where they apply, else XLA), GPU and TPU.
- 'splash': Pallas splash attention (TPU), causal by position inside each
  segment, GQA by the multi-query kernel per kv head. Its blocks are 128
  long: other lengths (a learner's prompt + response - 1) are padded to
  them with segment id 0, which no real query sees, and cut back.
On GPU 'auto' takes cuDNN, then tokamax (both on lengths padded to
`FUSED_BLOCK`: cuDNN refuses odd ones); on TPU splash, then tokamax; XLA
otherwise. All equal the reference on every position that sees a key (a
padding query, which sees none, is undefined: each implementation fills it
differently and nothing reads it).

`cache_attention` implementations: 'pallas' (TPU: `kernels.decode_attention`,
one Pallas kernel per (row, kv head) that streams the written blocks of the
cache through VMEM with an online softmax, so the fp32 scores never go to
HBM; on a mesh per shard in `shard_map`; elsewhere only when forced, in
Pallas' interpreter, for tests); 'cpu_kernel' (CPU, fp32, unsharded, where
`_cpu` finds it faster) writes the new keys / values into the cache in
place and attends over the used slots; 'xla' otherwise: two einsums around
the softmax, its scores [B, K, T*G, S] written to memory and read back.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from absl import flags

from cascade_jax import kernels
from cascade_jax.ops import _cpu
from cascade_jax.ops import _registry

_NEG_INF = -1e30  # finite: a query with no visible key (padding) gets no NaN


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) * scale over the last axis, in fp32, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(var + eps) * scale.astype(jnp.float32)
  return y.astype(x.dtype)


def apply_rope(x_btnh: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotary embedding, "rotate half" layout (Llama / Qwen); cos, sin [B, T, 1, H/2]."""
  h = x_btnh.shape[-1]
  x = x_btnh.astype(jnp.float32)
  x1, x2 = x[..., : h // 2], x[..., h // 2:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_btnh.dtype)


def attention_mask(q_pos_bt, q_seg_bt, k_pos_bs, k_seg_bs) -> jax.Array:
  """[B, T, S]: same non-zero segment, and key position <= query position.

  Positions restart in each packed segment, so within a segment the position
  test is the causal test; segment id 0 marks padding / empty cache slots.
  """
  same = q_seg_bt[:, :, None] == k_seg_bs[:, None, :]
  valid = (k_seg_bs != 0)[:, None, :]
  causal = k_pos_bs[:, None, :] <= q_pos_bt[:, :, None]
  return same & valid & causal


def _masked_softmax(logits, mask, scale: float, dtype):
  logits = jnp.where(mask, logits * scale, _NEG_INF)
  return jax.nn.softmax(logits, axis=-1).astype(dtype)


# ----------------------------------------------------------- over a sequence


def _xla(q, k, v, mask_bts, scale):
  b, t, n, h = q.shape
  kh = k.shape[2]
  q = q.reshape(b, t, kh, n // kh, h)
  logits = jnp.einsum('btkgh,bskh->bkgts', q, k,
                      preferred_element_type=jnp.float32)
  probs = _masked_softmax(logits, mask_bts[:, None, None], scale, q.dtype)
  out = jnp.einsum('bkgts,bskh->btkgh', probs, v)
  return out.reshape(b, t, n, h)


def _cudnn(q, k, v, mask_bts, scale):
  return jax.nn.dot_product_attention(q, k, v, mask=mask_bts[:, None],
                                      scale=scale, implementation='cudnn')


def tokamax_module():
  """tokamax, imported, with absl's flags marked parsed if nobody parsed them.

  tokamax reads its options from absl flags and, unparsed, parses sys.argv
  itself: under pytest, a notebook or an argparse program that is an
  unknown-flag error at the first kernel call.
  """
  import tokamax  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return tokamax


def _tokamax(q, k, v, mask_bts, scale):
  return tokamax_module().dot_product_attention(q, k, v, mask=mask_bts[:, None],
                                                scale=scale)


# cuDNN's fused attention refuses a masked training call whose lengths are
# odd ("Unsupported sequence length Q 383, KV 383", H200, jax 0.11.2), which
# every learner length prompt + response - 1 can be: the GPU kernels get
# lengths padded to this block (masked keys, queries cut after).
FUSED_BLOCK = 128


def _padded(kernel, q, k, v, mask_bts, scale, block: int = FUSED_BLOCK):
  """`kernel(q, k, v, mask, scale)` with T and S padded to `block`: padded
  keys are masked for every query, padded queries (which see nothing) are
  cut from the result."""
  t, s = q.shape[1], k.shape[1]
  pt, ps = -t % block, -s % block
  if pt or ps:
    along = lambda x, n: jnp.pad(x, [(0, 0), (0, n)] + [(0, 0)] * (x.ndim - 2))
    q, k, v = along(q, pt), along(k, ps), along(v, ps)
    mask_bts = jnp.pad(mask_bts, [(0, 0), (0, pt), (0, ps)])
  return kernel(q, k, v, mask_bts, scale)[:, :t]


SPLASH_BLOCK = 128


def pad_to_block(x, seg, block: int):
  """x [B, T, ...], seg [B, T] padded along T to a multiple of `block`
  (segment id 0: padding, seen by no real query)."""
  pad = -x.shape[1] % block
  if not pad:
    return x, seg
  widths = [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
  return jnp.pad(x, widths), jnp.pad(seg, ((0, 0), (0, pad)))


def _splash(q, k, v, q_seg, k_seg, scale):
  """Splash attention, its lengths padded to its blocks, cut back after."""
  t = q.shape[1]
  q, q_seg = pad_to_block(q, q_seg, SPLASH_BLOCK)
  k, k_seg = pad_to_block(k, k_seg, SPLASH_BLOCK)
  v, _ = pad_to_block(v, jnp.zeros(v.shape[:2], jnp.int32), SPLASH_BLOCK)
  return _splash_blocks(q, k, v, q_seg, k_seg, scale)[:, :t]


def _splash_blocks(q, k, v, q_seg, k_seg, scale):
  """Splash attention per batch row and kv head (multi-query over its G query heads)."""
  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as sk)
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_mask as sm)
  b, t, n, h = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = n // kh
  mask = sm.MultiHeadMask([sm.CausalMask((t, s)) for _ in range(g)])
  kernel = sk.make_splash_mqa_single_device(mask)
  qs = (q * scale).reshape(b, t, kh, g, h).transpose(0, 2, 3, 1, 4)  # B K G T H
  ks = k.transpose(0, 2, 1, 3)                                        # B K S H
  vs = v.transpose(0, 2, 1, 3)

  def one(q_gth, k_sh, v_sh, qseg, kseg):
    return kernel(q_gth, k_sh, v_sh, segment_ids=sk.SegmentIds(qseg, kseg))
  per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))
  out = jax.vmap(per_head)(qs, ks, vs, q_seg, k_seg)                  # B K G T H
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def tokamax_available() -> bool | str:
  try:
    import tokamax  # noqa: F401  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return f'tokamax does not import here ({e})'
  return True


def _attention_candidates(q, k, packed_causal: bool):
  backend = _registry.backend()
  half = q.dtype in (jnp.bfloat16, jnp.float16)
  h = q.shape[-1]
  on_gpu = backend == 'gpu' or _registry.elsewhere(
      f'needs a GPU (backend {backend})')
  cudnn = on_gpu
  if cudnn is True and not half:
    cudnn = f'cuDNN flash attention takes bf16 / fp16, not {q.dtype}'
  elif cudnn is True and (h % 8 or h > 128):
    cudnn = f'cuDNN flash attention needs head_dim % 8 == 0, <= 128 ({h})'
  splash = backend == 'tpu' or _registry.elsewhere(
      f'needs a TPU (backend {backend})')
  if splash is True and not packed_causal:
    splash = 'splash takes segment ids and a causal mask, not a general mask'
  tok = tokamax_available()
  if backend not in ('gpu', 'tpu'):  # tokamax runs XLA here: only if forced
    return [('xla', True), ('cudnn', cudnn), ('splash', splash),
            ('tokamax', tok)]
  return [('cudnn', cudnn), ('splash', splash), ('tokamax', tok),
          ('xla', True)]


def attention(q_btnh, k_bskh, v_bskh, *, scale: float,
              mask_bts: jax.Array | None = None,
              segment_ids: tuple[jax.Array, jax.Array] | None = None,
              positions: tuple[jax.Array, jax.Array] | None = None,
              shard: tuple[Any, tuple[str, ...]] | None = None):
  """Grouped-query attention of T queries over S keys.

  Args:
    q_btnh: [B, T, N, H] queries (QK-norm and RoPE applied).
    k_bskh, v_bskh: [B, S, K, H] keys / values, N a multiple of K.
    scale: the logits' scale.
    mask_bts: [B, T, S] which keys each query sees; if None, built from
      `segment_ids` and `positions` (q's and k's) by `attention_mask`.
    segment_ids, positions: (q [B, T], k [B, S]) each; with them splash can
      run (its mask is causal by index inside each segment, which is the
      position test for packed rows whose positions count up from 0).
    shard: (mesh, the mesh axes the batch is split over) for a model on a
      mesh: a kernel (cuDNN, tokamax, splash) then runs per batch shard in
      `shard_map` (Mosaic kernels cannot be partitioned automatically);
      heads are gathered for it.

  Returns:
    [B, T, N, H] in q's dtype.
  """
  packed = segment_ids is not None and positions is not None
  if mask_bts is None:
    if not packed:
      raise ValueError('attention: give mask_bts, or segment_ids and positions')
    mask_bts = attention_mask(positions[0], segment_ids[0], positions[1],
                              segment_ids[1])
  name = _registry.pick('attention', _attention_candidates(
      q_btnh, k_bskh, packed), dtype=q_btnh.dtype,
                        shape=f'q {q_btnh.shape}, k {k_bskh.shape}')
  if name == 'xla':
    return _xla(q_btnh, k_bskh, v_bskh, mask_bts, scale)
  if name == 'splash':
    fn = lambda q, k, v, qs, ks: _splash(q, k, v, qs, ks, scale)
    args = (q_btnh, k_bskh, v_bskh, segment_ids[0], segment_ids[1])
  else:
    kernel = _cudnn if name == 'cudnn' else _tokamax
    fn = lambda q, k, v, m: _padded(kernel, q, k, v, m, scale)
    args = (q_btnh, k_bskh, v_bskh, mask_bts)
  if shard is None:
    return fn(*args)
  mesh, batch_axes = shard
  spec = jax.sharding.PartitionSpec(tuple(batch_axes) or None)
  return jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * len(args),
                       out_specs=spec, check_vma=False)(*args)


# ------------------------------------------------------------- over a cache


def write_at(buf, x, index, *, axis):
  """`buf` [B, ...] with `x` written along `axis` from `index`, [] (every
  row) or [B] (each row its own slot: continuous batching)."""
  if not jnp.ndim(index):
    return jax.lax.dynamic_update_slice_in_dim(buf, x, index, axis=axis)
  put = lambda b, u, i: jax.lax.dynamic_update_slice_in_dim(b, u, i,
                                                            axis=axis - 1)
  return jax.vmap(put)(buf, x, index)


def _write_kv(k_new, v_new, cache_k, cache_v, index):
  """The cache (keys [B, K, H, S], values [B, K, S, H]) with the T new keys /
  values [B, T, K, H] written at `index`."""
  keys = write_at(cache_k, k_new.transpose(0, 2, 3, 1).astype(cache_k.dtype),
                  index, axis=3)
  values = write_at(cache_v, v_new.transpose(0, 2, 1, 3).astype(cache_v.dtype),
                    index, axis=2)
  return keys, values


def _norm_rope(q, k, qk_norm, norm_eps, rope):
  """QK-norm (scales (w_q, w_k) or None), then RoPE ((cos, sin) or None)."""
  if qk_norm is not None:
    q, k = rms_norm(q, qk_norm[0], norm_eps), rms_norm(k, qk_norm[1], norm_eps)
  if rope is not None:
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
  return q, k


def _write_cache(q, k_new, v_new, cache_k, cache_v, index):
  """The cache with the T new keys / values written at `index`, and the
  queries as [B, K, T*G, H]: one plain batched matmul per kv head over the
  cache (for decoding, T = 1, ~1.7x faster on XLA:CPU than the five-axis
  einsum with G and T as separate dot dimensions)."""
  b, t, n, h = q.shape
  kh = cache_k.shape[1]
  keys, values = _write_kv(k_new, v_new, cache_k, cache_v, index)
  q = q.reshape(b, t, kh, n // kh, h).transpose(0, 2, 1, 3, 4).reshape(
      b, kh, t * (n // kh), h)
  return q, keys, values


def _cache_xla(q, k_new, v_new, cache_k, cache_v, mask_bts, index, scale):
  b, t, n, h = q.shape
  kh = cache_k.shape[1]
  g = n // kh
  dt = q.dtype
  q, keys, values = _write_cache(q, k_new, v_new, cache_k, cache_v, index)
  logits = jnp.einsum('bkqh,bkhs->bkqs', q, keys.astype(dt),
                      preferred_element_type=jnp.float32)
  probs = _masked_softmax(logits.reshape(b, kh, t, g, -1),
                          mask_bts[:, None, :, None], scale, dt)
  probs = probs.reshape(b, kh, t * g, -1)
  out = jnp.einsum('bkqs,bksh->bkqh', probs, values.astype(dt))
  out = out.reshape(b, kh, t, g, h).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, t, n, h), keys, values


# The written-blocks path: cache blocks of this many slots, for caches of
# at least WRITTEN_MIN_BLOCKS of them (shorter ones read the whole cache in
# one matmul: the main job's 256 slots, where a loop costs more than it saves).
WRITTEN_BLOCK = 512
WRITTEN_MIN_BLOCKS = 4


def written_blocks_ok(slots: int, block: int = WRITTEN_BLOCK) -> bool | str:
  """Whether a cache of `slots` is read in written blocks, else why not."""
  if slots % block:
    return _registry.elsewhere(f'the cache ({slots} slots) is not a multiple '
                               f'of the {block}-slot block')
  if slots < WRITTEN_MIN_BLOCKS * block:
    return _registry.elsewhere(f'a short cache ({slots} slots < '
                               f'{WRITTEN_MIN_BLOCKS} blocks) is read whole')
  return True


def cache_slots(n: int) -> int:
  """The slots to allocate for a cache of `n`: `n`, or rounded up to the
  blocks of the implementation that reads it: the Pallas kernel's (on a TPU,
  or forced), or, where the written-blocks path is forced
  (`cache_attention=xla_written`; it is never picked by itself), a long
  cache to its block. The extra slots are never written, and so never seen."""
  forced = _registry.forced_choice('cache_attention')
  if forced == 'xla_written' and n >= WRITTEN_MIN_BLOCKS * WRITTEN_BLOCK:
    return -(-n // WRITTEN_BLOCK) * WRITTEN_BLOCK
  if forced == 'pallas' or (forced == _registry.AUTO and
                            _registry.backend() == 'tpu'):
    block = min(kernels.DECODE_ATTENTION_BLOCKS)
    return -(-n // block) * block
  return n


def _cache_written(q, k_new, v_new, cache_k, cache_v, mask_bts, index, scale,
                   block: int = WRITTEN_BLOCK):
  """`_cache_xla` reading only the blocks written so far.

  Slots [0, index + T) rounded up to `block` are read, one block at a time
  in a loop with a dynamic trip count (online softmax: a running maximum,
  sum and weighted values), so a decode step's cost follows the length
  written, not the cache's size: early in a 10k-slot generation a step
  reads one block of it. Slots past the written ones are masked anyway
  (segment 0), so the result is `_cache_xla`'s up to float order, for
  every token that sees a slot (a padding token that sees none gets 0).
  """
  b, t, n, h = q.shape
  kh = cache_k.shape[1]
  g = n // kh
  dt = q.dtype
  q, keys, values = _write_cache(q, k_new, v_new, cache_k, cache_v, index)
  blocks = (index + t + block - 1) // block

  def body(j, carry):
    top, total, acc = carry            # [B, K, T, G], same, [B, K, T*G, H]
    kb = jax.lax.dynamic_slice_in_dim(keys, j * block, block, axis=3)
    vb = jax.lax.dynamic_slice_in_dim(values, j * block, block, axis=2)
    seen = jax.lax.dynamic_slice_in_dim(mask_bts, j * block, block, axis=2)
    seen = seen[:, None, :, None]      # [B, 1, T, 1, block]
    logits = jnp.einsum('bkqh,bkhs->bkqs', q, kb.astype(dt),
                        preferred_element_type=jnp.float32)
    logits = jnp.where(seen, logits.reshape(b, kh, t, g, block) * scale,
                       -jnp.inf)
    new_top = jnp.maximum(top, logits.max(-1))
    safe = jnp.where(jnp.isfinite(new_top), new_top, 0.0)
    p = jnp.where(seen, jnp.exp(logits - safe[..., None]), 0.0)
    fade = jnp.where(jnp.isfinite(top), jnp.exp(top - safe), 0.0)
    total = total * fade + p.sum(-1)
    pv = jnp.einsum('bkqs,bksh->bkqh', p.reshape(b, kh, t * g, block),
                    vb.astype(jnp.float32))
    acc = acc * fade.reshape(b, kh, t * g, 1) + pv
    return new_top, total, acc

  init = (jnp.full((b, kh, t, g), -jnp.inf, jnp.float32),
          jnp.zeros((b, kh, t, g), jnp.float32),
          jnp.zeros((b, kh, t * g, h), jnp.float32))
  _, total, acc = jax.lax.fori_loop(0, blocks, body, init)
  total = total.reshape(b, kh, t * g, 1)
  out = jnp.where(total > 0, acc / jnp.where(total > 0, total, 1.0), 0.0)
  out = out.astype(dt).reshape(b, kh, t, g, h).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, t, n, h), keys, values


def _cache_pallas(q, k_new, v_new, cache_k, cache_v, mask_bts, index, scale,
                  shard, head_axes):
  """`_cache_xla` as one Pallas kernel over the written blocks (see
  `kernels.decode_attention`); on a mesh per (batch, kv-head) shard."""
  b, t, n, h = q.shape
  kh, s = cache_k.shape[1], cache_k.shape[3]
  g = n // kh
  q, keys, values = _write_cache(q, k_new, v_new, cache_k, cache_v, index)
  # One mask row serves every query of a single new token; a block of T
  # tokens gives each of its T * G query rows its own (row t * G + g).
  mask = (mask_bts if t == 1 else jnp.repeat(mask_bts, g, axis=1)).astype(
      jnp.int32)
  written = jnp.broadcast_to(index + t, (b,)).astype(jnp.int32)
  fn = functools.partial(kernels.decode_attention, scale=scale,
                         block=kernels.decode_attention_block(s),
                         interpret=_registry.backend() != 'tpu')
  if shard is not None:
    mesh, batch_axes = shard
    rows = tuple(batch_axes) or None
    heads = jax.sharding.PartitionSpec(rows, tuple(head_axes) or None)
    by_row = jax.sharding.PartitionSpec(rows)
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(heads, heads, heads, by_row,
                                                by_row),
                       out_specs=heads, check_vma=False)
  out = fn(q, keys, values, mask, written)                 # [B, K, T*G, H]
  out = out.reshape(b, kh, t, g, h).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, t, n, h), keys, values


def _pallas_ok(cache_k, q) -> bool | str:
  """Whether the Pallas decode kernel takes this call, else why not."""
  if (_registry.backend() != 'tpu' and
      _registry.forced_choice('cache_attention') != 'pallas'):
    return _registry.elsewhere(f'a TPU kernel (backend {_registry.backend()}; '
                               'forced, it runs interpreted)')
  slots = cache_k.shape[3]
  if kernels.decode_attention_block(slots) is None:
    return (f'the Pallas decode kernel reads blocks of '
            f'{kernels.DECODE_ATTENTION_BLOCKS} slots; the cache has {slots} '
            '(ops.cache_slots rounds a cache up to them on a TPU)')
  if q.shape[2] % cache_k.shape[1]:
    return f'{q.shape[2]} query heads over {cache_k.shape[1]} kv heads'
  return True    # elsewhere than a TPU: forced, in Pallas' interpreter


def cache_attention(q_btnh, k_new_btkh, v_new_btkh, cache_k_bkhs, cache_v_bksh,
                    mask_bts, index, *, scale: float,
                    qk_norm: tuple[jax.Array, jax.Array] | None = None,
                    norm_eps: float = 0.0,
                    rope: tuple[jax.Array, jax.Array] | None = None,
                    shard: tuple[Any, tuple[str, ...]] | None = None,
                    head_axes: tuple[str, ...] = ()):
  """Writes T new keys / values into the cache at `index`, then attends over it.

  The cache is (keys [B, K, H, S], values [B, K, S, H]): batch and head axes
  major, so that a decode step's two dots read it in place, keys with the
  slot axis minor, so that q . k is a plain [T*G, H] @ [H, S] matmul.

  Args:
    q_btnh: [B, T, N, H] queries; k_new_btkh, v_new_btkh: [B, T, K, H]; q
      and k before the QK-norm and RoPE, which are applied here.
    cache_k_bkhs, cache_v_bksh: the cache; mask_bts: [B, T, S] slots each new
      token sees (the written slots included); index: [] first slot to write
      (every row), or [B] (each row its own: continuous batching).
    qk_norm: (w_q [H], w_k [H]) RMSNorm scales, or None; rope: (cos, sin)
      [B, T, 1, H/2] each, or None.
    shard: (mesh, the mesh axes the batch is split over) for a model on a
      mesh (a custom call has no SPMD rule, so the CPU kernel does not run;
      the Pallas kernel runs per shard in `shard_map`); head_axes: the mesh
      axes the kv heads are split over.

  Returns:
    (out [B, T, N, H] in q's dtype, new cache keys, new cache values).
  """
  sharded = shard is not None
  kernel = _cpu.kernel_enabled('cache_attention')
  if kernel is True and (cache_k_bkhs.dtype != jnp.float32 or
                         q_btnh.dtype != jnp.float32):
    kernel = _registry.elsewhere('the CPU kernel is fp32 only')
  elif kernel is True and sharded:
    kernel = _registry.elsewhere(
        'a sharded cache (a custom call has no SPMD rule)')
  elif kernel is True and jnp.ndim(index):
    kernel = 'the CPU kernel writes one slot for every row (continuous batching writes a slot a row)'
  written = written_blocks_ok(cache_k_bkhs.shape[3])
  if written is True and jnp.ndim(index):
    written = 'a per-row write index (continuous batching) has no one written length'
  # 'xla_written' only when forced (--config.ops=cache_attention=xla_written):
  # on this CPU it ran 8 x slower than the whole-cache read at 4,096 slots
  # (docs/results/perf/decode_cache_2026-12-03); unmeasured on accelerators.
  pallas = _pallas_ok(cache_k_bkhs, q_btnh)
  name = _registry.pick(
      'cache_attention', [('pallas', pallas), ('cpu_kernel', kernel),
                          ('xla', True), ('xla_written', written)],
      dtype=q_btnh.dtype, shape=f'cache {tuple(cache_k_bkhs.shape)}')
  if name == 'cpu_kernel':
    out, ck, cv = kernels.cache_attention(
        q_btnh, k_new_btkh, v_new_btkh, cache_k_bkhs, cache_v_bksh, mask_bts,
        index, scale=scale, qk_norm=qk_norm, norm_eps=norm_eps, rope=rope)
    return out.astype(q_btnh.dtype), ck, cv
  q, k = _norm_rope(q_btnh, k_new_btkh, qk_norm, norm_eps, rope)
  if name == 'pallas':
    return _cache_pallas(q, k, v_new_btkh, cache_k_bkhs, cache_v_bksh,
                         mask_bts, index, scale, shard, head_axes)
  impl = _cache_written if name == 'xla_written' else _cache_xla
  return impl(q, k, v_new_btkh, cache_k_bkhs, cache_v_bksh, mask_bts, index,
              scale)


def prefill_attention(q_btnh, k_new_btkh, v_new_btkh, cache_k_bkhs,
                      cache_v_bksh, mask_bts, index, *, scale: float,
                      segment_ids: jax.Array, positions: jax.Array,
                      qk_norm: tuple[jax.Array, jax.Array] | None = None,
                      norm_eps: float = 0.0,
                      rope: tuple[jax.Array, jax.Array] | None = None,
                      shard: tuple[Any, tuple[str, ...]] | None = None,
                      head_axes: tuple[str, ...] = ()):
  """`cache_attention` into a cache that holds nothing yet (the sampler's
  prefill of new prompts): the same result and cache.

  Implementations: 'cache' (`cache_attention`: the T new tokens attend over
  every slot of the cache, written or not, with XLA's einsums; 30B at a
  10,240-slot cache: 8.3 TB of HBM traffic a chip a prefill in the plan)
  and 'fused' (they attend over themselves with `attention`, splash /
  cuDNN on an accelerator, and are written into the cache at `index`).
  'auto' takes 'fused' on GPU / TPU and 'cache' on CPU, where the whole
  cache is small and the main job's numerics stay as they were.

  Args: as `cache_attention`; `segment_ids`, `positions` [B, T]: the new
  tokens' (0: padding); `shard` as `attention`'s; `head_axes` as
  `cache_attention`'s (the 'cache' path's Pallas kernel keeps the kv heads
  split over them instead of gathering them). `index` must be one slot
  for every row ([]), and the slots before it empty.
  """
  fused = True if not jnp.ndim(index) else (
      'a per-row write index (continuous batching)')
  candidates = [('fused', fused), ('cache', True)]
  if _registry.backend() not in ('gpu', 'tpu'):
    candidates.reverse()
  name = _registry.pick('prefill_attention', candidates, dtype=q_btnh.dtype,
                        shape=f'q {tuple(q_btnh.shape)}, cache '
                              f'{tuple(cache_k_bkhs.shape)}')
  if name == 'cache':
    return cache_attention(q_btnh, k_new_btkh, v_new_btkh, cache_k_bkhs,
                           cache_v_bksh, mask_bts, index, scale=scale,
                           qk_norm=qk_norm, norm_eps=norm_eps, rope=rope,
                           shard=shard, head_axes=head_axes)
  q, k = _norm_rope(q_btnh, k_new_btkh, qk_norm, norm_eps, rope)
  out = attention(q, k, v_new_btkh, scale=scale,
                  segment_ids=(segment_ids, segment_ids),
                  positions=(positions, positions), shard=shard)
  return (out, *_write_kv(k, v_new_btkh, cache_k_bkhs, cache_v_bksh, index))


__all__ = ['apply_rope', 'attention', 'attention_mask', 'cache_attention',
           'cache_slots', 'prefill_attention', 'rms_norm', 'write_at']
