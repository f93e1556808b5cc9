"""One MoE layer's decode step: the CPU kernel against XLA's decode layouts."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from cascade_jax import kernels
from cascade_jax import ops
from cascade_jax.model._layers import is_gated
from cascade_jax.rollout._decode import decode_forward
from cascade_jax.rollout._decode import decode_weights
from cascade_jax.utils import time_fn


def moe_decode_benchmark(*, batch_sizes: Sequence[int], embed_dim: int,
                         expert_dim: int, num_experts: int, top_k: int,
                         activation: str, steps: int = 100,
                         repeats: int = 3) -> list[dict]:
  """Microseconds per MoE layer per decode step: the CPU kernel against XLA's decode layouts.

  One row per batch size: `decode_forward` over `steps` steps (in
  a `fori_loop`, each step's output feeding the next) with the layer's
  `decode_weights` laid out once, with and without the CPU kernel (run
  here whether or not the calibration picks it for the sampler).
  Random (distinct) expert choices per token, as a router makes them.
  """
  key = jax.random.key(0)
  kg, ku, kd = jax.random.split(key, 3)
  e, d, f = num_experts, embed_dim, expert_dim
  ws = (jax.random.normal(kg, (e, d, f)) * d ** -0.5,
        jax.random.normal(ku, (e, d, f)) * d ** -0.5
        if is_gated(activation) else None,
        jax.random.normal(kd, (e, f, d)) * f ** -0.5)
  rows = []
  for n in batch_sizes:
    kx, ki, kw = jax.random.split(jax.random.fold_in(key, n), 3)
    x = jax.random.normal(kx, (n, d))
    idx = jnp.argsort(jax.random.uniform(ki, (n, e)), axis=-1)[:, :top_k]
    w = jax.random.uniform(kw, (n, top_k))
    row = dict(batch=n)
    for name, use_kernel in (('kernel', True), ('xla', False)):
      def run(x, ws, use_kernel=use_kernel):
        dw = decode_weights(ws, n, top_k, act=activation,
                            use_kernel=use_kernel)
        step = lambda i, x: x + 1e-3 * decode_forward(
            x, idx, w, dw, act=activation)
        return jax.lax.fori_loop(0, steps, step, x)
      if use_kernel and not kernels.moe_ffn_available(activation, x.dtype):
        row[name] = float('nan')
        continue
      with ops.forced(moe_decode='cpu_kernel' if use_kernel else 'xla'):
        row[name] = time_fn(jax.jit(run), x, ws, repeats=repeats) / steps * 1e6
    rows.append(row)
  return rows
