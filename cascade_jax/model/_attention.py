"""Grouped-query attention with optional RoPE / QK-norm, packed-segment masks and a KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import kernels
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._layers import param
from cascade_jax.model._layers import RMSNorm
from cascade_jax.sharding import ShardingCtx

_NEG_INF = -1e30  # finite: a query with no visible key (padding) gets no NaN


def rope_tables(positions_bt: jax.Array, head_dim: int,
                theta: float) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, T, 1, H/2]: computed once per forward pass, shared by every layer."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                              / head_dim))
  ang = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  return jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]


def rope(x_btnh: jax.Array, positions_bt: jax.Array | None, theta: float,
         tables: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
  """Rotary embedding, "rotate half" layout (as in Llama / Qwen)."""
  h = x_btnh.shape[-1]
  cos, sin = tables or rope_tables(positions_bt, h, theta)
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


def _masked_softmax(logits, mask, head_dim: int, dtype):
  """softmax(logits / sqrt(head_dim)) over the last (key) axis, masked keys excluded."""
  logits = jnp.where(mask, logits * head_dim ** -0.5, _NEG_INF)
  return jax.nn.softmax(logits, axis=-1).astype(dtype)


class Attention(nnx.Module):
  """GQA: N query heads share K key/value heads in groups of N // K."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               ctx: ShardingCtx | None = None):
    d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pdt = jnp.dtype(cfg.param_dtype)
    self.cfg = cfg
    self.ctx = ctx
    self.w_q_dnh = param(rngs, (d, n, h), ('embed', 'heads', 'head_dim'), dtype=pdt)
    self.w_k_dkh = param(rngs, (d, k, h), ('embed', 'kv_heads', 'head_dim'), dtype=pdt)
    self.w_v_dkh = param(rngs, (d, k, h), ('embed', 'kv_heads', 'head_dim'), dtype=pdt)
    self.w_o_nhd = param(rngs, (n, h, d), ('heads', 'head_dim', 'embed'),
                         std=(n * h) ** -0.5, dtype=pdt)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, eps=cfg.norm_eps, dtype=pdt)
      self.k_norm = RMSNorm(h, eps=cfg.norm_eps, dtype=pdt)
    else:
      self.q_norm = self.k_norm = None

  def __call__(self, x_btd, *, positions_bt, segment_ids_bt, kv_cache=None,
               cache_index=None, cache_positions_bs=None,
               cache_segment_ids_bs=None, rope_cs=None, mask_bts=None):
    """Attends x over itself, or over a KV cache that x's keys are written into.

    Over a cache on the CPU backend in fp32, one kernel writes the cache in
    place and attends (`_cache_kernel`); elsewhere XLA's ops below.

    The cache is (keys [B, K, H, S], values [B, K, S, H]): batch and head
    axes major, so that the decode step's two dots read it in place (a
    [B, S, K, H] cache was transposed, i.e. copied whole, at every step), and
    keys with the slot axis minor, so that q . k is a plain [T*G, H] @ [H, S]
    matmul (with keys as [S, H] XLA:CPU repacked the whole cache at every
    step: a decode step's attention at batch 64 took 1.5x as long). `rope_cs` (from
    `rope_tables`) and `mask_bts` (from `attention_mask`) may be passed
    precomputed, once for all layers.

    Returns (y [B, T, D], (k, v)): the new keys/values [B, T, K, H], or the
    updated cache.
    """
    cfg = self.cfg
    b, t, d = x_btd.shape
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dt = x_btd.dtype
    x_nd = x_btd.reshape(b * t, d)
    # Flat 2D matmuls: on XLA:CPU their backward pass is ~2x faster than 3D.
    q = (x_nd @ self.w_q_dnh[...].astype(dt).reshape(d, n * h)).reshape(b, t, n, h)
    kk = (x_nd @ self.w_k_dkh[...].astype(dt).reshape(d, k * h)).reshape(b, t, k, h)
    v = (x_nd @ self.w_v_dkh[...].astype(dt).reshape(d, k * h)).reshape(b, t, k, h)
    if cfg.use_rope and rope_cs is None:
      rope_cs = rope_tables(positions_bt, h, cfg.rope_theta)
    if kv_cache is not None and self._cache_kernel(dt, kv_cache):
      # One CPU kernel: QK-norm, RoPE, the new keys / values written into
      # the cache in place (XLA's update copied the cache) and attention
      # over the slots in use (XLA's dots below read every slot).
      if mask_bts is None:
        mask_bts = attention_mask(positions_bt, segment_ids_bt,
                                  cache_positions_bs, cache_segment_ids_bs)
      norm = (None if self.q_norm is None else
              (self.q_norm.scale[...], self.k_norm.scale[...]))
      out, *new_kv = kernels.cache_attention(
          q, kk, v, *kv_cache, mask_bts, cache_index, scale=h ** -0.5,
          qk_norm=norm, norm_eps=cfg.norm_eps,
          rope=rope_cs if cfg.use_rope else None)
      out = out.astype(dt)
    else:
      out, new_kv = self._attend(
          q, kk, v, positions_bt=positions_bt, segment_ids_bt=segment_ids_bt,
          kv_cache=kv_cache, cache_index=cache_index,
          cache_positions_bs=cache_positions_bs,
          cache_segment_ids_bs=cache_segment_ids_bs, rope_cs=rope_cs,
          mask_bts=mask_bts)
    out_nd = out.reshape(b * t, n * h)
    y = out_nd @ self.w_o_nhd[...].astype(dt).reshape(n * h, d)
    return y.reshape(b, t, d), tuple(new_kv)

  def _attend(self, q, kk, v, *, positions_bt, segment_ids_bt, kv_cache,
              cache_index, cache_positions_bs, cache_segment_ids_bs, rope_cs,
              mask_bts):
    """XLA's attention: QK-norm and RoPE, then over x itself or over the cache."""
    cfg = self.cfg
    b, t, n, h = q.shape
    k = cfg.num_kv_heads
    dt = q.dtype
    if self.q_norm is not None:
      q, kk = self.q_norm(q), self.k_norm(kk)
    if cfg.use_rope:
      q = rope(q, None, cfg.rope_theta, rope_cs)
      kk = rope(kk, None, cfg.rope_theta, rope_cs)

    g = n // k
    if kv_cache is None:
      q = q.reshape(b, t, k, g, h)
      logits = jnp.einsum('btkgh,bskh->bkgts', q, kk,
                          preferred_element_type=jnp.float32)
      if mask_bts is None:
        mask_bts = attention_mask(positions_bt, segment_ids_bt, positions_bt,
                                  segment_ids_bt)
      probs = _masked_softmax(logits, mask_bts[:, None, None], h, dt)
      out = jnp.einsum('bkgts,bskh->btkgh', probs, v)  # [B, T, K, G, H]
      new_kv = (kk, v)
    else:
      ck, cv = kv_cache
      keys = jax.lax.dynamic_update_slice_in_dim(
          ck, kk.transpose(0, 2, 3, 1).astype(ck.dtype), cache_index, axis=3)
      values = jax.lax.dynamic_update_slice_in_dim(
          cv, v.transpose(0, 2, 1, 3).astype(cv.dtype), cache_index, axis=2)
      new_kv = (keys, values)
      # Queries as [B, K, T*G, H]: one plain batched matmul per kv head over
      # the cache (for decoding, T = 1, ~1.7x faster on XLA:CPU than the
      # five-axis einsum with G and T as separate dot dimensions).
      q = q.reshape(b, t, k, g, h).transpose(0, 2, 1, 3, 4).reshape(b, k, t * g, h)
      logits = jnp.einsum('bkqh,bkhs->bkqs', q, keys.astype(dt),
                          preferred_element_type=jnp.float32)
      if mask_bts is None:
        mask_bts = attention_mask(positions_bt, segment_ids_bt,
                                  cache_positions_bs, cache_segment_ids_bs)
      probs = _masked_softmax(logits.reshape(b, k, t, g, -1),
                              mask_bts[:, None, :, None], h, dt)
      probs = probs.reshape(b, k, t * g, -1)
      out = jnp.einsum('bkqs,bksh->bkqh', probs, values.astype(dt))
      out = out.reshape(b, k, t, g, h).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, t, n, h), new_kv

  def _cache_kernel(self, dtype, kv_cache) -> bool:
    """Whether attention over this cache runs the CPU kernel (`kernels.cache_attention`).

    On the CPU backend in fp32, unsharded (a custom call has no SPMD rule:
    a sharded model keeps XLA's ops), unless CASCADE_JAX_CPU_KERNELS=0.
    """
    return (self.ctx is None and kv_cache[0].dtype == jnp.float32 and
            kernels.cache_attention_available(dtype))
