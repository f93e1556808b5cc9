"""The sparse MoE expert FFN on CPU (moe_cpu.cc), for decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cascade_jax.kernels import _build

_TARGET = 'cascade_jax_moe_ffn'

_ACTIVATIONS = {'swiglu': 0, 'relu2': 1}


def moe_ffn_available(act: str, dtype) -> bool:
  """Whether `moe_ffn` can run here: CPU backend, fp32, a known activation, built."""
  return act in _ACTIVATIONS and _build.available(_TARGET, dtype)


def moe_ffn(x_nd: jax.Array, idx_nk: jax.Array, w_nk: jax.Array,
            w_gate_edf: jax.Array, w_up_edf: jax.Array | None,
            w_down_efd: jax.Array, *, act: str) -> jax.Array:
  """y[n] = sum_j w[n, j] * FFN_{idx[n, j]}(x[n]), computing only the chosen pairs.

  FFN_e(x) = act(x @ w_gate[e], x @ w_up[e]) @ w_down[e] (`act` as in
  `model._layers.activation`; w_up None for the non-gated relu2). Equals the
  model's `dense` dispatch up to float rounding (the sums run in another
  order). Deterministic and batch-invariant: a token's output is
  bit-identical run after run and whatever other tokens share the call.
  Forward only (no VJP): the sampler's decode path. Call only where
  `moe_ffn_available(act, jnp.float32)`.

  Args:
    x_nd: [N, D] fp32 tokens; idx_nk: [N, k] int expert ids in [0, E);
    w_nk: [N, k] gate weights.
    w_gate_edf / w_up_edf: [E, D, F]; w_down_efd: [E, F, D]; all fp32.

  Returns:
    [N, D] fp32.
  """
  target = _build.target(_TARGET)
  if (w_up_edf is None) != (act != 'swiglu'):
    raise ValueError(f'moe_ffn: act {act!r} with w_up '
                     f'{"missing" if w_up_edf is None else "given"}')
  call = jax.ffi.ffi_call(
      target, jax.ShapeDtypeStruct(x_nd.shape, jnp.float32),
      vmap_method='sequential')
  return call(x_nd.astype(jnp.float32), idx_nk.astype(jnp.int32),
              w_nk.astype(jnp.float32), w_gate_edf,
              w_gate_edf if w_up_edf is None else w_up_edf, w_down_efd,
              act=np.int64(_ACTIVATIONS[act]))
