"""Grouped-query attention with optional RoPE / QK-norm, packed-segment masks and a KV cache.

The attention itself is `cascade_jax.ops` (`attention`, `cache_attention`):
XLA's einsums, cuDNN, splash, tokamax or the CPU kernel, picked there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import ops
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._layers import param
from cascade_jax.model._layers import RMSNorm
from cascade_jax.sharding import ShardingCtx

attention_mask = ops.attention_mask


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
  cos, sin = tables or rope_tables(positions_bt, x_btnh.shape[-1], theta)
  return ops.apply_rope(x_btnh, cos, sin)


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
               cache_segment_ids_bs=None, rope_cs=None, mask_bts=None,
               fresh_cache=False):
    """Attends x over itself, or over a KV cache that x's keys are written into.

    The cache is (keys [B, K, H, S], values [B, K, S, H]); see
    `ops.cache_attention`. `rope_cs` (from `rope_tables`) and `mask_bts`
    (from `attention_mask`) may be passed precomputed, once for all layers.

    `fresh_cache`: the cache holds nothing before `cache_index` (the
    sampler's prefill of new prompts): `ops.prefill_attention`.

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
    if kv_cache is not None:
      if mask_bts is None:
        mask_bts = attention_mask(positions_bt, segment_ids_bt,
                                  cache_positions_bs, cache_segment_ids_bs)
      norm = (None if self.q_norm is None else
              (self.q_norm.scale[...], self.k_norm.scale[...]))
      if fresh_cache:
        out, *new_kv = ops.prefill_attention(
            q, kk, v, *kv_cache, mask_bts, cache_index, scale=h ** -0.5,
            segment_ids=segment_ids_bt, positions=positions_bt,
            qk_norm=norm, norm_eps=cfg.norm_eps,
            rope=rope_cs if cfg.use_rope else None,
            shard=None if self.ctx is None else (
                self.ctx.mesh, self.ctx.mesh_axes('batch')),
            head_axes=() if self.ctx is None else self.ctx.mesh_axes(
                'kv_heads'))
      else:
        out, *new_kv = ops.cache_attention(
            q, kk, v, *kv_cache, mask_bts, cache_index, scale=h ** -0.5,
            qk_norm=norm, norm_eps=cfg.norm_eps,
            rope=rope_cs if cfg.use_rope else None,
            shard=None if self.ctx is None else (
                self.ctx.mesh, self.ctx.mesh_axes('batch')),
            head_axes=() if self.ctx is None else self.ctx.mesh_axes(
                'kv_heads'))
    else:
      if self.q_norm is not None:
        q, kk = self.q_norm(q), self.k_norm(kk)
      if cfg.use_rope:
        q, kk = ops.apply_rope(q, *rope_cs), ops.apply_rope(kk, *rope_cs)
      out = ops.attention(
          q, kk, v, scale=h ** -0.5, mask_bts=mask_bts,
          segment_ids=(segment_ids_bt, segment_ids_bt),
          positions=(positions_bt, positions_bt),
          shard=None if self.ctx is None else (
              self.ctx.mesh, self.ctx.mesh_axes('batch')))
      new_kv = (kk, v)
    out_nd = out.reshape(b * t, n * h)
    y = out_nd @ self.w_o_nhd[...].astype(dt).reshape(n * h, d)
    return y.reshape(b, t, d), tuple(new_kv)
