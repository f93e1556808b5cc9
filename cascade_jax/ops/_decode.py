"""The sampler's per-step ops: the sparse MoE expert FFN and the token argmax.

Each returns None / falls back to XLA's formulation unless its CPU kernel
is picked (CPU, fp32, and `_cpu` finds it faster here or it is forced):
the XLA formulation of the MoE step lives with the sampler's weight layouts
(`cascade_jax.rollout`), which asks `moe_decode_kernel` first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax import kernels
from cascade_jax.ops import _cpu
from cascade_jax.ops import _registry


def moe_decode_uses_kernel(act: str, dtype) -> bool:
  """Whether the sampler's MoE steps run the CPU kernel (`moe_ffn`), recorded."""
  ok = _cpu.kernel_enabled('moe_decode')
  if ok is True and jnp.dtype(dtype) != jnp.float32:
    ok = _registry.elsewhere('the CPU kernel is fp32 only')
  elif ok is True and not kernels.moe_ffn_available(act, dtype):
    ok = _registry.elsewhere(f'no CPU kernel for activation {act!r}')
  return _registry.pick('moe_decode', [('cpu_kernel', ok), ('xla', True)],
                        dtype=dtype) == 'cpu_kernel'


def moe_ffn_available(act: str, dtype) -> bool:
  """Whether the CPU kernel's sparse expert FFN can run `act` in `dtype` here."""
  return kernels.moe_ffn_available(act, dtype)


def moe_ffn(x_nd, idx_nk, w_nk, w_gate_edf, w_up_edf, w_down_efd, *, act: str):
  """The CPU kernel's sparse expert FFN (see `kernels.moe_ffn`), in x's dtype."""
  return kernels.moe_ffn(x_nd, idx_nk, w_nk, w_gate_edf, w_up_edf, w_down_efd,
                         act=act).astype(x_nd.dtype)


def argmax(x_bv: jax.Array) -> jax.Array:
  """jnp.argmax over the last axis (the first index of the maximum), int32.

  XLA:CPU runs jnp.argmax's (value, index) reduction as scalar code; two
  plain reductions (a max, then the least index equal to it) are faster,
  and the CPU kernel faster still where `_cpu` measured it so.
  """
  ok = _cpu.kernel_enabled('argmax')
  if ok is True and x_bv.dtype != jnp.float32:
    ok = _registry.elsewhere('the CPU kernel is fp32 only')
  if _registry.pick('argmax', [('cpu_kernel', ok), ('xla', True)],
                    dtype=x_bv.dtype) == 'cpu_kernel':
    return kernels.argmax(x_bv)
  top = jnp.max(x_bv, axis=-1, keepdims=True)
  idx = jnp.arange(x_bv.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x_bv == top, idx, x_bv.shape[-1]), axis=-1)
