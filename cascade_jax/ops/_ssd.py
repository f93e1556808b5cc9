"""Mamba-2's selective state space: chunked SSD (training, prefill) and the one-token step (decoding).

Both compute, per head h with a state S [P, N] (fp32 whatever the inputs),

    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,    y_t = S_t C_t + D_h x_t

`ssd` runs it in chunks of Q positions, state-space duality (Dao & Gu
2024): inside a chunk a masked [Q, Q] "attention" (C_l . B_s) times the
decay exp(sum_{s<j<=l} dt_j A), between chunks a recurrence over the chunk
states. Decays are sums over the masked cumulative-sum matrix (`segsum`),
never differences of cumulative sums, which lose precision once they grow.

Packed rows: `reset_bt` marks positions whose state starts afresh (the first
token of each packed example, or a prompt's first token after its left
padding); no state crosses a reset, in either the intra-chunk matrix or the
chunk recurrence. An `initial_state` (a cache's) reaches the positions before
the first reset.

Implementations: 'xla' (einsums; the reference, on every backend). A Pallas
kernel would slot in beside it through `_registry.pick`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cascade_jax.ops import _registry


def _segsum(a: jax.Array) -> jax.Array:
  """[..., Q] -> [..., Q, Q]: out[l, s] = sum_{s < j <= l} a[j] for l >= s.

  The masked-cumsum form: each entry is a sum of the a[j] it covers (never a
  difference of prefix sums). Entries above the diagonal are 0 here; callers
  mask them.
  """
  q = a.shape[-1]
  strict = jnp.tril(jnp.ones((q, q), bool), -1)          # [j, s]: j > s
  return jnp.cumsum(jnp.where(strict, a[..., :, None], 0.0), axis=-2)


def _run_ids(reset_bt: jax.Array) -> jax.Array:
  """[B, T] int32: how many resets at or before each position (0 before any)."""
  return jnp.cumsum(reset_bt.astype(jnp.int32), axis=1)


def ssd(x_bthp: jax.Array, dt_bth: jax.Array, a_h: jax.Array,
        b_btgn: jax.Array, c_btgn: jax.Array, d_h: jax.Array, *,
        chunk: int, reset_bt: jax.Array | None = None,
        initial_state: jax.Array | None = None
        ) -> tuple[jax.Array, jax.Array]:
  """The SSM over a sequence, in chunks: (y [B, T, H, P] fp32, final state [B, H, P, N] fp32).

  Args:
    x_bthp: inputs per head (after the conv).
    dt_bth: step sizes (softplus'd and clamped), > 0.
    a_h: A = -exp(A_log), < 0.
    b_btgn, c_btgn: B and C per group; head h reads group h // (H / G).
    d_h: the skip D.
    chunk: Q; the sequence is zero-padded to a multiple of it (a padded
      step has dt 0: it neither decays nor adds to the state).
    reset_bt: bool, True where the state restarts (None: never).
    initial_state: [B, H, P, N] carried in (None: zeros).
  """
  _registry.pick('ssd', [('xla', True)], dtype=x_bthp.dtype)
  f32 = jnp.float32
  b, t, h, p = x_bthp.shape
  g, n = b_btgn.shape[2], b_btgn.shape[3]
  if h % g:
    raise ValueError(f'ssd: {h} heads do not split into {g} groups')
  if chunk <= 0:
    raise ValueError(f'ssd: chunk must be positive, got {chunk}')
  x = x_bthp.astype(f32)
  dt = dt_bth.astype(f32)
  rep = lambda z: jnp.repeat(z.astype(f32), h // g, axis=2)   # groups -> heads
  bb, cc = rep(b_btgn), rep(c_btgn)
  if reset_bt is None:
    reset_bt = jnp.zeros((b, t), bool)
  run = _run_ids(reset_bt)

  pad = -t % chunk
  if pad:
    zpad = lambda z: jnp.pad(z, [(0, 0), (0, pad)] + [(0, 0)] * (z.ndim - 2))
    x, dt, bb, cc = map(zpad, (x, dt, bb, cc))
    run = jnp.pad(run, [(0, 0), (0, pad)], mode='edge')
  nc = (t + pad) // chunk
  ch = lambda z: z.reshape(b, nc, chunk, *z.shape[2:])
  x, dt, bb, cc, run = map(ch, (x, dt, bb, cc, run))   # [B, C, Q, ...]

  da = jnp.moveaxis(dt * a_h.astype(f32), -1, 2)       # [B, C, H, Q]
  xdt = x * dt[..., None]                               # [B, C, Q, H, P]

  # 1. Inside each chunk: y_l += sum_{s<=l} (C_l . B_s) decay(s -> l) x_s dt_s.
  causal = jnp.tril(jnp.ones((chunk, chunk), bool))
  same = run[:, :, :, None] == run[:, :, None, :]      # [B, C, Q(l), Q(s)]
  keep = (causal & same)[:, :, None]                    # [B, C, 1, Q, Q]
  seg = _segsum(da)                                     # [B, C, H, Q, Q]
  decay = jnp.where(keep, jnp.exp(jnp.where(keep, seg, 0.0)), 0.0)
  cb = jnp.einsum('bclhn,bcshn->bchls', cc, bb)
  y = jnp.einsum('bchls,bcshp->bclhp', cb * decay, xdt)

  # 2. Each chunk's own contribution to the state at its end.
  to_end = decay[:, :, :, -1, :]                        # [B, C, H, Q(s)]
  chunk_states = jnp.einsum('bcshn,bchs,bcshp->bchpn', bb, to_end, xdt)

  # 3. Between chunks: the state at each chunk's start. Index i of the
  # padded sequence is "after chunk i - 1" (0: the initial state); the
  # state after chunk z reaches after chunk i if no reset lies in between.
  if initial_state is None:
    initial_state = jnp.zeros((b, h, p, n), f32)
  states = jnp.concatenate([initial_state.astype(f32)[:, None],
                            chunk_states], axis=1)      # [B, C+1, H, P, N]
  total = jnp.pad(jnp.cumsum(da, axis=-1)[..., -1], [(0, 0), (1, 0), (0, 0)])
  run_end = jnp.pad(run[:, :, -1], [(0, 0), (1, 0)])   # [B, C+1]; 0 at start
  reach = (jnp.tril(jnp.ones((nc + 1, nc + 1), bool))[None] &
           (run_end[:, :, None] == run_end[:, None, :]))[:, None]
  seg_c = _segsum(jnp.moveaxis(total, 1, 2))            # [B, H, C+1, C+1]
  carry = jnp.where(reach, jnp.exp(jnp.where(reach, seg_c, 0.0)), 0.0)
  states = jnp.einsum('bhiz,bzhpn->bihpn', carry, states)
  starts, final = states[:, :-1], states[:, -1]

  # 4. The chunk-start state read out at each position it reaches.
  from_start = jnp.exp(jnp.cumsum(da, axis=-1))          # [B, C, H, Q]
  reached = run == run_end[:, :-1, None]                  # [B, C, Q]
  from_start = from_start * reached[:, :, None, :]
  y = y + jnp.einsum('bclhn,bchpn,bchl->bclhp', cc, starts, from_start)

  y = y.reshape(b, nc * chunk, h, p)[:, :t]
  y = y + d_h.astype(f32)[:, None] * x_bthp.astype(f32)
  return y, final


def ssd_step(state_bhpn: jax.Array, x_bhp: jax.Array, dt_bh: jax.Array,
             a_h: jax.Array, b_bgn: jax.Array, c_bgn: jax.Array,
             d_h: jax.Array, reset_b: jax.Array | None = None
             ) -> tuple[jax.Array, jax.Array]:
  """One token: (y [B, H, P] fp32, the new state [B, H, P, N] fp32)."""
  f32 = jnp.float32
  h, g = x_bhp.shape[1], b_bgn.shape[1]
  state = state_bhpn.astype(f32)
  if reset_b is not None:
    state = jnp.where(reset_b[:, None, None, None], 0.0, state)
  dt = dt_bh.astype(f32)
  x = x_bhp.astype(f32)
  bb = jnp.repeat(b_bgn.astype(f32), h // g, axis=1)    # [B, H, N]
  cc = jnp.repeat(c_bgn.astype(f32), h // g, axis=1)
  decay = jnp.exp(dt * a_h.astype(f32))                  # [B, H]
  state = (state * decay[:, :, None, None] +
           (x * dt[:, :, None])[..., None] * bb[:, :, None, :])
  y = jnp.einsum('bhpn,bhn->bhp', state, cc) + d_h.astype(f32)[:, None] * x
  return y, state
