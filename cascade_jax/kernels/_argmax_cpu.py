"""Row-wise argmax on CPU (argmax_cpu.cc): the sampler's token choice."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax.kernels import _build

_TARGET = 'cascade_jax_argmax'


def argmax_available(dtype) -> bool:
  """Whether `argmax` can run here: CPU backend, fp32, built."""
  return _build.available(_TARGET, dtype)


def argmax(x: jax.Array) -> jax.Array:
  """jnp.argmax(x, axis=-1) for fp32 x [..., N] -> int32 [...].

  The first index of each row's maximum; a NaN counts as the maximum (as
  jnp.argmax). One vectorised pass and one scan per row (XLA:CPU's argmax
  reduction runs as scalar code). Call only where
  `argmax_available(jnp.float32)`.
  """
  target = _build.target(_TARGET)
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32),
                          vmap_method='sequential')
  return call(x.astype(jnp.float32))
