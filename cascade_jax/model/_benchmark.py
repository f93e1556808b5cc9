"""MoE layer speed: each dispatch path (forward + backward) against the ideal dense MLP."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax.model._config import ModelConfig
from cascade_jax.model._config import MoEConfig
from cascade_jax.model._layers import is_gated
from cascade_jax.model._layers import Mlp
from cascade_jax.model._moe import MoE
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
  n_mat = 3 if is_gated(activation) else 2
  useful_flops = 3 * 2 * tokens * embed_dim * top_k * expert_dim * n_mat
  peak = matmul_gflops(matmul_size, dtype, repeats)

  ideal = Mlp(embed_dim, top_k * expert_dim, activation_name=activation,
              rngs=nnx.Rngs(0), dtype=jnp.dtype(dtype))
  ideal_s, _ = _fwd_bwd_seconds(
      ideal, x, lambda m, x: (m(x.reshape(-1, embed_dim)), {}), repeats)
  rows = [dict(path='ideal dense MLP', seconds=ideal_s, ratio=1.0,
               gflops=useful_flops / ideal_s / 1e9, dropped=0.0)]
  for path in paths:
    cfg = ModelConfig(
        vocab_size=8, embed_dim=embed_dim, pattern='E', num_heads=1,
        num_kv_heads=1, head_dim=8, dtype=dtype, param_dtype=dtype,
        moe=MoEConfig(num_experts=num_experts, top_k=top_k,
                      expert_dim=expert_dim, activation=activation,
                      dispatch=path, capacity_factor=capacity_factor))
    s, info = _fwd_bwd_seconds(MoE(cfg, rngs=nnx.Rngs(0)), x,
                               lambda m, x: m(x), repeats)
    rows.append(dict(path=path, seconds=s, ratio=s / ideal_s,
                     gflops=useful_flops / s / 1e9,
                     dropped=float(info['dropped'])))
  for r in rows:
    r['of_peak'] = r['gflops'] / peak
  rows.append(dict(path=f'matmul {matmul_size}^3', seconds=float('nan'),
                   ratio=float('nan'), gflops=peak, dropped=0.0, of_peak=1.0))
  return rows
