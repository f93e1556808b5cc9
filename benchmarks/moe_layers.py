"""The MoE layer benchmarks that moe, accel and rollout share.

`moe_layer_benchmark`: one MoE layer's forward + backward per dispatch path
against the ideal dense MLP. `moe_decode_benchmark`: one MoE layer's decode
step, the CPU kernel against XLA's decode layouts. Benchmarks live here, not
in the library: they time the library's public functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import rollout
from cascade_jax.utils import time_fn


def _fwd_bwd_seconds(module: nnx.Module, x_btd: jax.Array, call,
                     repeats: int) -> tuple[float, dict]:
  graph, params, rest = nnx.split(module, nnx.Param, ...)

  @jax.jit
  def step(params, x):
    def loss(params, x):
      y, info = call(nnx.merge(graph, params, rest), x)
      return jnp.mean(jnp.square(y.astype(jnp.float32))), info
    (_, info), grads = jax.value_and_grad(loss, argnums=(0, 1),
                                          has_aux=True)(params, x)
    return grads, info

  seconds = time_fn(step, params, x_btd, repeats=repeats)
  return seconds, step(params, x_btd)[1]


def matmul_gflops(n: int, dtype: str = 'float32', repeats: int = 5) -> float:
  """Rate of one n x n x n matmul on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  t = time_fn(jax.jit(jnp.matmul), a, a, repeats=repeats)
  return 2 * n ** 3 / t / 1e9


def moe_layer_benchmark(*, tokens: int, embed_dim: int, expert_dim: int,
                        num_experts: int, top_k: int, activation: str,
                        capacity_factor: float, dtype: str,
                        paths: Sequence[str], repeats: int,
                        matmul_size: int) -> list[dict]:
  """One row per path (and the ideal MLP): seconds, ratio to ideal, GFLOP/s.

  The ideal is a dense MLP of width top_k * expert_dim: the FLOPs a perfect
  MoE does. GFLOP/s counts those useful FLOPs (fwd + bwd = 3x fwd), so the
  "of peak" column is the fraction of the large-matmul rate the layer reaches.
  """
  batch = 8 if tokens % 8 == 0 else 1
  x = jax.random.normal(jax.random.key(0), (batch, tokens // batch, embed_dim),
                        jnp.dtype(dtype))
  n_mat = 3 if model_lib.is_gated(activation) else 2
  useful_flops = 3 * 2 * tokens * embed_dim * top_k * expert_dim * n_mat
  peak = matmul_gflops(matmul_size, dtype, repeats)

  ideal = model_lib.Mlp(embed_dim, top_k * expert_dim, activation_name=activation,
              rngs=nnx.Rngs(0), dtype=jnp.dtype(dtype))
  ideal_s, _ = _fwd_bwd_seconds(
      ideal, x, lambda m, x: (m(x.reshape(-1, embed_dim)), {}), repeats)
  rows = [dict(path='ideal dense MLP', seconds=ideal_s, ratio=1.0,
               gflops=useful_flops / ideal_s / 1e9, dropped=0.0)]
  for path in paths:
    cfg = model_lib.ModelConfig(
        vocab_size=8, embed_dim=embed_dim, pattern='E', num_heads=1,
        num_kv_heads=1, head_dim=8, dtype=dtype, param_dtype=dtype,
        moe=model_lib.MoEConfig(num_experts=num_experts, top_k=top_k,
                      expert_dim=expert_dim, activation=activation,
                      dispatch=path, capacity_factor=capacity_factor))
    s, info = _fwd_bwd_seconds(model_lib.MoE(cfg, rngs=nnx.Rngs(0)), x,
                               lambda m, x: m(x), repeats)
    rows.append(dict(path=path, seconds=s, ratio=s / ideal_s,
                     gflops=useful_flops / s / 1e9,
                     dropped=float(info['dropped'])))
  for r in rows:
    r['of_peak'] = r['gflops'] / peak
  rows.append(dict(path=f'matmul {matmul_size}^3', seconds=float('nan'),
                   ratio=float('nan'), gflops=peak, dropped=0.0, of_peak=1.0))
  return rows


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
        if model_lib.is_gated(activation) else None,
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
        dw = rollout.decode_weights(ws, n, top_k, act=activation,
                            use_kernel=use_kernel)
        step = lambda i, x: x + 1e-3 * rollout.decode_forward(
            x, idx, w, dw, act=activation)
        return jax.lax.fori_loop(0, steps, step, x)
      if use_kernel and not ops.moe_ffn_available(activation, x.dtype):
        row[name] = float('nan')
        continue
      with ops.forced(moe_decode='cpu_kernel' if use_kernel else 'xla'):
        row[name] = time_fn(jax.jit(run), x, ws, repeats=repeats) / steps * 1e6
    rows.append(row)
  return rows
