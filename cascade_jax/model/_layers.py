"""Small layers: parameters with logical axes, RMSNorm, activations, dense MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import ops
from cascade_jax.sharding import ShardingCtx


def param(rngs: nnx.Rngs | None, shape, axes, *, std: float | None = None,
          init: str = 'normal', dtype=jnp.float32) -> nnx.Param:
  """A parameter that records its logical axes (used by cascade_jax.sharding).

  `std` defaults to 1/sqrt(fan_in) with fan_in the first dimension.
  """
  if init == 'ones':
    value = jnp.ones(shape, dtype)
  elif init == 'zeros':
    value = jnp.zeros(shape, dtype)
  else:
    std = shape[0] ** -0.5 if std is None else std
    value = (std * jax.random.normal(rngs.params(), shape)).astype(dtype)
  return nnx.Param(value, logical_axes=tuple(axes))


def activation(name: str, gate: jax.Array, up: jax.Array | None) -> jax.Array:
  if name == 'swiglu':
    return jax.nn.silu(gate) * up
  if name == 'relu2':  # non-gated squared ReLU (Nemotron-H)
    return jnp.square(jax.nn.relu(gate))
  raise ValueError(f'unknown activation {name!r}')


def is_gated(name: str) -> bool:
  return name == 'swiglu'


class RMSNorm(nnx.Module):
  """x / rms(x) * scale, computed in fp32."""

  def __init__(self, dim: int, *, eps: float, axis_name: str = 'norm',
               dtype=jnp.float32):
    self.eps = eps
    self.scale = param(None, (dim,), (axis_name,), init='ones', dtype=dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    return ops.rms_norm(x, self.scale[...], self.eps)


class Mlp(nnx.Module):
  """Dense FFN: SwiGLU (gate, up, down) or non-gated squared ReLU (up, down)."""

  def __init__(self, embed_dim: int, mlp_dim: int, *, activation_name: str,
               rngs: nnx.Rngs, ctx: ShardingCtx | None = None,
               dtype=jnp.float32):
    self.activation_name = activation_name
    self.ctx = ctx
    self.w_gate_df = param(rngs, (embed_dim, mlp_dim), ('embed', 'mlp'),
                           dtype=dtype)
    if is_gated(activation_name):
      self.w_up_df = param(rngs, (embed_dim, mlp_dim), ('embed', 'mlp'),
                           dtype=dtype)
    else:
      self.w_up_df = None
    self.w_down_fd = param(rngs, (mlp_dim, embed_dim), ('mlp', 'embed'),
                           dtype=dtype)

  def __call__(self, x_nd: jax.Array) -> jax.Array:
    """x: [..., D] -> [..., D]. Callers flatten tokens: 2D matmuls are faster."""
    dt = x_nd.dtype
    gate = x_nd @ self.w_gate_df[...].astype(dt)  # [N, F]
    up = x_nd @ self.w_up_df[...].astype(dt) if self.w_up_df is not None else None
    h = activation(self.activation_name, gate, up)
    if self.ctx is not None:
      h = self.ctx.constrain(h, ('batch',) + (None,) * (h.ndim - 2) + ('mlp',))
    return h @ self.w_down_fd[...].astype(dt)
