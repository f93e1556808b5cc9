"""Attention over the KV cache on CPU (attention_cpu.cc), writing the new keys / values in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cascade_jax.kernels import _build

_TARGET = 'cascade_jax_cache_attention'


def cache_attention_available(dtype) -> bool:
  """Whether `cache_attention` can run here: CPU backend, fp32, built."""
  return _build.available(_TARGET, dtype)


def cache_attention(q_btnh: jax.Array, k_new_btkh: jax.Array,
                    v_new_btkh: jax.Array, cache_k_bkhs: jax.Array,
                    cache_v_bksh: jax.Array, mask_bts: jax.Array,
                    index: jax.Array, *, scale: float,
                    qk_norm: tuple[jax.Array, jax.Array] | None = None,
                    norm_eps: float = 0.0,
                    rope: tuple[jax.Array, jax.Array] | None = None,
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Writes T new keys / values into the cache at `index`, then attends over it.

  The queries and new keys are first put through the model's QK-norm
  (x / sqrt(mean(x^2) + norm_eps) * w, per head) and rotate-half RoPE, when
  given. Grouped-query: query head n reads kv head n // G, G = N / K:

    cache_k[b, n // G, :, index + t] = k_new[b, t, n // G],  likewise cache_v
    out[b, t, n] = sum_s p[s] cache_v[b, n // G, s],
    p = softmax_s(scale * q[b, t, n] . cache_k[b, n // G, :, s]
                  over the slots s where mask[b, t, s])

  as the model's XLA path computes it, up to float rounding: a
  dynamic_update_slice (its start clamped to [0, S - T]), then two dots
  around a masked softmax, where a query that sees no slot (padding) gets
  the mean of every slot's value. Slots past the last one any query of a
  batch row sees are not read. The cache outputs alias the cache inputs:
  inside a jitted loop XLA updates the cache in place instead of copying
  it. Deterministic and batch-invariant. Forward only. Call only where
  `cache_attention_available(jnp.float32)`.

  Args:
    q_btnh: [B, T, N, H] queries, before the QK-norm and RoPE.
    k_new_btkh, v_new_btkh: [B, T, K, H] the new tokens' keys (before the
      QK-norm and RoPE) and values.
    cache_k_bkhs: [B, K, H, S]; cache_v_bksh: [B, K, S, H] (fp32).
    mask_bts: [B, T, S] bool, which slots each new token may see (the
      written slots included).
    index: [] int32, the first slot to write.
    scale: the logits' scale (head_dim ** -0.5).
    qk_norm: (w_q [H], w_k [H]), the QK-norm's scales, or None.
    norm_eps: the QK-norm's epsilon.
    rope: (cos, sin) from `model.rope_tables` ([B, T, 1, H/2] each), or None.

  Returns:
    (out [B, T, N, H], cache_k, cache_v), fp32.
  """
  target = _build.target(_TARGET)
  f32 = jnp.float32
  b, t = q_btnh.shape[:2]
  none = jnp.zeros((0,), f32)
  w_q, w_k = (none, none) if qk_norm is None else qk_norm
  cos, sin = ((none, none) if rope is None else
              (x.reshape(b, t, -1) for x in rope))
  call = jax.ffi.ffi_call(
      target,
      (jax.ShapeDtypeStruct(q_btnh.shape, f32),
       jax.ShapeDtypeStruct(cache_k_bkhs.shape, f32),
       jax.ShapeDtypeStruct(cache_v_bksh.shape, f32)),
      input_output_aliases={3: 1, 4: 2}, vmap_method='sequential')
  return call(q_btnh.astype(f32), k_new_btkh.astype(f32),
              v_new_btkh.astype(f32), cache_k_bkhs.astype(f32),
              cache_v_bksh.astype(f32), mask_bts.astype(bool),
              jnp.asarray(index, jnp.int32), w_q.astype(f32), w_k.astype(f32),
              cos.astype(f32), sin.astype(f32), scale=np.float32(scale),
              eps=np.float32(norm_eps))
