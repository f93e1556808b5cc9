"""The Mamba-2 mixer of Nemotron-H ('M' layers), as transformers' `NemotronHMamba2Mixer` computes it.

    z, x, B, C, dt = in_proj(u)                 (one projection per part)
    x, B, C = silu(causal depthwise conv(x, B, C))
    dt = max(softplus(dt + dt_bias), dt_min);   A = -exp(A_log)
    y = SSD(x, dt, A, B, C) + D x               (`ops.ssd`: chunked; `ops.ssd_step`: one token)
    out = out_proj(rmsnorm_per_group(y * silu(z)))

The projection is stored split (z, x, B, C, dt) rather than as one
[D, 2 H P + 2 G N + H] matrix, so that heads shard over the `tensor` axis
('ssm_heads') with each shard's B / C groups beside them ('ssm_groups';
replicated where the tensor axis does not divide the groups). The Hugging
Face files keep the fused layout; `checkpoint.load_hf_nemotron_h` splits it.

Packed rows and left padding: the conv and the SSM restart wherever the
segment id changes, so no state crosses from one example (or from padding)
into the next. transformers zeroes padding positions instead, which equals
a restart for left padding only.

State for decoding (`MambaState`): the conv's last K - 1 inputs (masked to
the current segment) and the SSM state [B, H, P, N], fp32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import ops
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._layers import param
from cascade_jax.sharding import ShardingCtx

HEADS = ('batch', None, 'ssm_heads', None)
GROUPS = ('batch', None, 'ssm_groups', None)


class MambaState(NamedTuple):
  """One Mamba layer's decoding state."""
  conv_x: jax.Array    # [B, K-1, H, P]   the conv's last inputs, compute dtype
  conv_b: jax.Array    # [B, K-1, G, N]
  conv_c: jax.Array    # [B, K-1, G, N]
  ssm: jax.Array       # [B, H, P, N]     fp32


def init_state(cfg: ModelConfig, batch: int, dtype) -> MambaState:
  m = cfg.mamba
  k = m.conv_kernel - 1
  return MambaState(
      conv_x=jnp.zeros((batch, k, m.num_heads, m.head_dim), dtype),
      conv_b=jnp.zeros((batch, k, m.num_groups, m.state_dim), dtype),
      conv_c=jnp.zeros((batch, k, m.num_groups, m.state_dim), dtype),
      ssm=jnp.zeros((batch, m.num_heads, m.head_dim, m.state_dim),
                    jnp.float32))


def state_axes() -> MambaState:
  """Logical axes of each `MambaState` field (for sharding a cache)."""
  return MambaState(conv_x=HEADS, conv_b=GROUPS, conv_c=GROUPS,
                    ssm=('batch', 'ssm_heads', None, None))


def resets(segment_ids_bt: jax.Array, prev_segment_b: jax.Array | None = None
           ) -> jax.Array:
  """[B, T] bool: where the state restarts (the segment id changes).

  `prev_segment_b`: the segment of the token before position 0 (a cache's
  last), None when nothing precedes.
  """
  seg = segment_ids_bt
  first = (jnp.zeros(seg.shape[:1], bool) if prev_segment_b is None else
           seg[:, 0] != prev_segment_b)
  return jnp.concatenate([first[:, None], seg[:, 1:] != seg[:, :-1]], axis=1)


def causal_conv(x_btf, w_kf, bias_f, state_bkf, run_bt):
  """Depthwise causal conv over time of [B, T, *F] with K taps, segment-aware.

  Tap k reads position t - (K - 1 - k) (positions before 0 come from
  `state_bkf`, the previous K - 1 inputs), and only from the same run of
  `run_bt` (state entries belong to run 0). Returns (out [B, T, *F] fp32,
  the new state: the last K - 1 inputs, zeroed where they are not in the
  last position's run).
  """
  k = w_kf.shape[0]
  t = x_btf.shape[1]
  xp = jnp.concatenate([state_bkf.astype(x_btf.dtype), x_btf], axis=1)
  runp = jnp.pad(run_bt, [(0, 0), (k - 1, 0)])
  extra = (None,) * (x_btf.ndim - 2)
  out = jnp.zeros(x_btf.shape, jnp.float32)
  if bias_f is not None:
    out = out + bias_f.astype(jnp.float32)
  for i in range(k):
    same = (runp[:, i:i + t] == run_bt)[(...,) + extra]
    out = out + jnp.where(same, xp[:, i:i + t].astype(jnp.float32), 0.0) * (
        w_kf[i].astype(jnp.float32))
  tail = xp[:, t:]
  keep = (runp[:, t:] == run_bt[:, -1:])[(...,) + extra]
  return out, jnp.where(keep, tail, jnp.zeros_like(tail))


def dt_bias_init(key, num_heads: int, dt_min: float, dt_max: float,
                 floor: float = 1e-4) -> jax.Array:
  """inverse softplus of dt ~ log-uniform in [dt_min, dt_max] (Mamba's init)."""
  u = jax.random.uniform(key, (num_heads,))
  dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
  dt = jnp.maximum(dt, floor)
  return dt + jnp.log(-jnp.expm1(-dt))


class Mamba2(nnx.Module):
  """Mamba-2 mixer (Nemotron-H): [B, T, D] -> [B, T, D], with an optional decoding state."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               ctx: ShardingCtx | None = None):
    m = cfg.mamba
    d, h, p, g, n, k = (cfg.embed_dim, m.num_heads, m.head_dim, m.num_groups,
                        m.state_dim, m.conv_kernel)
    pdt = jnp.dtype(cfg.param_dtype)
    self.cfg = cfg
    self.ctx = ctx
    self.w_z_dhp = param(rngs, (d, h, p), ('embed', 'ssm_heads', None), dtype=pdt)
    self.w_x_dhp = param(rngs, (d, h, p), ('embed', 'ssm_heads', None), dtype=pdt)
    self.w_b_dgn = param(rngs, (d, g, n), ('embed', 'ssm_groups', None), dtype=pdt)
    self.w_c_dgn = param(rngs, (d, g, n), ('embed', 'ssm_groups', None), dtype=pdt)
    self.w_dt_dh = param(rngs, (d, h), ('embed', 'ssm_heads'), dtype=pdt)
    conv_std = (3 * k) ** -0.5   # torch Conv1d's default: uniform(+-1/sqrt(K))
    self.conv_x_khp = param(rngs, (k, h, p), (None, 'ssm_heads', None),
                            std=conv_std, dtype=pdt)
    self.conv_b_kgn = param(rngs, (k, g, n), (None, 'ssm_groups', None),
                            std=conv_std, dtype=pdt)
    self.conv_c_kgn = param(rngs, (k, g, n), (None, 'ssm_groups', None),
                            std=conv_std, dtype=pdt)
    if m.conv_bias:
      self.conv_bias_x_hp = param(rngs, (h, p), ('ssm_heads', None),
                                  std=conv_std, dtype=pdt)
      self.conv_bias_b_gn = param(rngs, (g, n), ('ssm_groups', None),
                                  std=conv_std, dtype=pdt)
      self.conv_bias_c_gn = param(rngs, (g, n), ('ssm_groups', None),
                                  std=conv_std, dtype=pdt)
    else:
      self.conv_bias_x_hp = self.conv_bias_b_gn = self.conv_bias_c_gn = None
    self.dt_bias_h = nnx.Param(
        dt_bias_init(rngs.params(), h, m.dt_init_min, m.dt_init_max).astype(jnp.float32),
        logical_axes=('ssm_heads',))
    self.a_log_h = nnx.Param(jnp.log(jnp.arange(1, h + 1, dtype=jnp.float32)),
                             logical_axes=('ssm_heads',))
    self.d_h = param(None, (h,), ('ssm_heads',), init='ones', dtype=jnp.float32)
    self.norm_hp = param(None, (h, p), ('ssm_heads', None), init='ones',
                         dtype=pdt)
    self.w_out_hpd = param(rngs, (h, p, d), ('ssm_heads', None, 'embed'),
                           std=(h * p) ** -0.5, dtype=pdt)

  def __call__(self, x_btd: jax.Array, *, reset_bt: jax.Array,
               state: MambaState | None = None
               ) -> tuple[jax.Array, MambaState | None]:
    """y [B, T, D] in x's dtype, and the state after the last position (if one was given).

    `reset_bt` (`resets`): where the conv and the SSM restart. With a
    `state`, the sequence continues it (before the first reset); a single
    token takes the recurrent step, more take the chunked scan.
    """
    m = self.cfg.mamba
    b, t, d = x_btd.shape
    h, p, g, n = m.num_heads, m.head_dim, m.num_groups, m.state_dim
    dt_ = x_btd.dtype
    u = x_btd.reshape(b * t, d)
    proj = lambda w, *shape: (u @ w[...].astype(dt_).reshape(d, -1)).reshape(
        b, t, *shape)
    z = self._constrain(proj(self.w_z_dhp, h, p), HEADS)
    xs = self._constrain(proj(self.w_x_dhp, h, p), HEADS)
    bs = self._constrain(proj(self.w_b_dgn, g, n), GROUPS)
    cs = self._constrain(proj(self.w_c_dgn, g, n), GROUPS)
    dt_raw = proj(self.w_dt_dh, h)

    if state is None:
      state = init_state(self.cfg, b, dt_)
      keep_state = False
    else:
      keep_state = True
    run = jnp.cumsum(reset_bt.astype(jnp.int32), axis=1)
    bias = lambda v: None if v is None else v[...]
    conv = lambda v, w, bb, s: causal_conv(v, w[...], bias(bb), s, run)
    xc, sx = conv(xs, self.conv_x_khp, self.conv_bias_x_hp, state.conv_x)
    bc, sb = conv(bs, self.conv_b_kgn, self.conv_bias_b_gn, state.conv_b)
    cc, sc = conv(cs, self.conv_c_kgn, self.conv_bias_c_gn, state.conv_c)
    xc, bc, cc = (jax.nn.silu(v).astype(dt_) for v in (xc, bc, cc))

    dt = jax.nn.softplus(dt_raw.astype(jnp.float32) + self.dt_bias_h[...])
    if m.dt_min > 0:
      dt = jnp.maximum(dt, m.dt_min)
    a = -jnp.exp(self.a_log_h[...].astype(jnp.float32))
    if t == 1 and keep_state:
      y, ssm = ops.ssd_step(state.ssm, xc[:, 0], dt[:, 0], a, bc[:, 0],
                            cc[:, 0], self.d_h[...], reset_bt[:, 0])
      y = y[:, None]
    else:
      y, ssm = ops.ssd(xc, dt, a, bc, cc, self.d_h[...], chunk=m.chunk_size,
                       reset_bt=reset_bt,
                       initial_state=state.ssm if keep_state else None)
    y = self._constrain(y, HEADS)

    # Gated RMSNorm per group of H / G heads (not over the whole width).
    gated = y * jax.nn.silu(z.astype(jnp.float32))
    grouped = gated.reshape(b, t, g, (h // g) * p)
    var = jnp.mean(jnp.square(grouped), axis=-1, keepdims=True)
    normed = (grouped * jax.lax.rsqrt(var + self.cfg.norm_eps)).reshape(
        b, t, h, p) * self.norm_hp[...].astype(jnp.float32)
    out = normed.astype(dt_).reshape(b * t, h * p) @ (
        self.w_out_hpd[...].astype(dt_).reshape(h * p, d))
    new_state = (MambaState(conv_x=sx, conv_b=sb, conv_c=sc, ssm=ssm)
                 if keep_state else None)
    return out.reshape(b, t, d), new_state

  def _constrain(self, v, axes):
    return v if self.ctx is None else self.ctx.constrain(v, axes)
