"""Expert compute: the `dense`, `ragged` and `capacity` dispatch paths.

Each path takes the tokens of one shard, their chosen experts and gate
weights, and returns the weighted sum of expert outputs. The functions are
written for one shard of a mesh: the collectives over the expert axis (and
the tensor axis, which splits the expert width) run when axis names are
given, so the same code is the single-device path (no axes) and the
expert-parallel path (inside `shard_map`).

- `dense`: every local expert on every token; the reference.
- `ragged`: dropless; assignments sorted by expert and fed to grouped
  matmuls (`ops.grouped_matmul`). Under expert parallelism, on GPU / TPU
  each (token, choice) pair travels to its expert's shard and back by
  `ragged_all_to_all`; on CPU (no `ragged_all_to_all` there) tokens are
  all-gathered over the expert axis and results reduce-scattered back
  (`ops.expert_exchange` picks).
- `capacity`: tokens gathered by index into [experts, capacity, embed]
  blocks (capacity = factor * tokens * top_k / experts, the overflow is
  dropped and counted), exchanged with `all_to_all` under expert parallelism.
  Both gathers have gather-only backward passes (see `_gather_rows`).
- `dropless`: `capacity`'s blocks when no expert overflows them, `dense`
  otherwise (`lax.cond`, per layer): exact, like `dense`, at about
  `capacity`'s cost. Every forward that scores a rollout (learner,
  reference, teachers, reward model) runs an exact path: `capacity` with a
  capacity large enough for the replayed routing (`replay_capacity`), or
  this one where the routing is not known in advance.

`ragged`'s grouped matmuls are `cascade_jax.ops.grouped_matmul` (tokamax's
kernels on GPU / TPU). Decoding (the sampler's few tokens a step) has its
own exact path over weights laid out once per generation: it lives with
the sampler, in `cascade_jax.rollout`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from cascade_jax import ops
from cascade_jax.model._layers import activation

Axes = tuple[str, ...]


def _axis_size(axes: Axes) -> int:
  return math.prod(jax.lax.axis_size(a) for a in axes) if axes else 1


@jax.custom_vjp
def _gather_rows(src_md, idx_n, inv_mr):
  """out[i] = src[idx[i]], or 0 where idx[i] == M (the padding row).

  `inv[m]` lists the (at most r) output rows that read source row m, padded
  with N. Then the backward pass is a gather and a sum over r instead of a
  scatter-add, which XLA:CPU runs several times slower.
  """
  del inv_mr
  src = jnp.concatenate([src_md, jnp.zeros_like(src_md[:1])], axis=0)
  return src[idx_n]


def _gather_rows_fwd(src_md, idx_n, inv_mr):
  return _gather_rows(src_md, idx_n, inv_mr), (idx_n, inv_mr)


def _gather_rows_bwd(res, g_nd):
  idx_n, inv_mr = res
  g = jnp.concatenate([g_nd, jnp.zeros_like(g_nd[:1])], axis=0)
  return g[inv_mr].sum(axis=1), None, None


_gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def _expert_mlp_ecd(x_ecd, w_gate_edf, w_up_edf, w_down_efd, act):
  """Every expert e on its own block of rows: [E, C, D] -> [E, C, D]."""
  g = jnp.einsum('ecd,edf->ecf', x_ecd, w_gate_edf)
  u = None if w_up_edf is None else jnp.einsum('ecd,edf->ecf', x_ecd, w_up_edf)
  return jnp.einsum('ecf,efd->ecd', activation(act, g, u), w_down_efd)


def _combine(y_nkd, w_nk):
  """Gate-weighted sum over each token's k experts: [N, k, D] -> [N, D]."""
  return jnp.einsum('nkd,nk->nd', y_nkd, w_nk.astype(y_nkd.dtype))


def flat_mlp(x_nd, comb_ne, w_gate_flat, w_up_flat, w_down_flat, act):
  """All experts on all tokens as two flat matmuls, gate weights in between."""
  num_experts = comb_ne.shape[1]
  g = x_nd @ w_gate_flat
  u = None if w_up_flat is None else x_nd @ w_up_flat
  h_nef = activation(act, g, u).reshape(x_nd.shape[0], num_experts, -1)
  h_nef = h_nef * comb_ne.astype(h_nef.dtype)[:, :, None]
  return h_nef.reshape(x_nd.shape[0], -1) @ w_down_flat


def combine_weights(idx_nk, w_nk, num_experts, first_expert=0):
  """[N, E]: the gate weight token n gives expert e (0 if unchosen)."""
  ids = first_expert + jnp.arange(num_experts)
  return jnp.einsum('nk,nke->ne', w_nk,
                    (idx_nk[..., None] == ids).astype(w_nk.dtype))


# ------------------------------------------------------------------ dense


def _dense_local(x_nd, idx_nk, w_nk, ws, act, first_expert):
  """Local experts on all tokens; only chosen (token, expert) pairs count.

  Written as two flat matmuls over all local experts at once ([N, D] @
  [D, E*F], then [N, E*F] @ [E*F, D] with the gate weights applied in
  between), which XLA:CPU runs faster than per-expert batched matmuls
  unless there are only a few tokens (decoding a small batch), where the
  transpose of the [E, D, F] weights that the flat form needs costs more.
  """
  w_gate, w_up, w_down = ws
  num_local, d, f = w_gate.shape
  comb_ne = combine_weights(idx_nk, w_nk, num_local, first_expert)
  if not _flat_dense(x_nd.shape[0], idx_nk.shape[1], num_local):
    x_end = jnp.broadcast_to(x_nd, (num_local,) + x_nd.shape)
    y_end = _expert_mlp_ecd(x_end, w_gate, w_up, w_down, act)
    return jnp.einsum('end,ne->nd', y_end, comb_ne.astype(y_end.dtype))
  flat = lambda w: w.transpose(1, 0, 2).reshape(d, num_local * f)
  return flat_mlp(x_nd, comb_ne, flat(w_gate),
                   None if w_up is None else flat(w_up),
                   w_down.reshape(num_local * f, d), act)


def _flat_dense(num_tokens: int, top_k: int, num_experts: int) -> bool:
  """Whether `dense` runs as two flat matmuls (else per-expert batched ones)."""
  return 2 * num_tokens * top_k > num_experts


# ----------------------------------------------------------------- ragged


def _grouped_mlp(xs_md, groups_g, ws, act):
  """The experts' MLP on rows sorted by expert (rows past the groups give 0)."""
  w_gate, w_up, w_down = ws
  g = ops.grouped_matmul(xs_md, w_gate, groups_g)
  u = None if w_up is None else ops.grouped_matmul(xs_md, w_up, groups_g)
  return ops.grouped_matmul(activation(act, g, u), w_down, groups_g)


def _ragged_local(x_nd, idx_nk, w_nk, ws, act, first_expert):
  """Sort (token, expert) pairs by local expert, two `ragged_dot`s, unsort.

  The sorted buffer has `ops.round_rows(N k)` rows (the kernel's tile); the
  rows past the pairs read the zero row and are read by nobody.
  """
  n, k = idx_nk.shape
  num_local = ws[0].shape[0]
  a = n * k
  rows = ops.round_rows(a)
  e_local = idx_nk.reshape(a) - first_expert
  is_local = (e_local >= 0) & (e_local < num_local)
  key = jnp.where(is_local, e_local, num_local)  # non-local pairs sort last
  order = jnp.argsort(key, stable=True)           # sorted row r <- pair order[r]
  rank = jnp.zeros((a,), jnp.int32).at[order].set(jnp.arange(a, dtype=jnp.int32))
  group_sizes = jnp.bincount(key, length=num_local + 1)[:num_local]
  # Sorted row r reads token order[r] // k; token m is read by rows rank[m*k+j].
  src = jnp.pad(order // k, (0, rows - a), constant_values=n)
  xs = _gather_rows(x_nd, src, rank.reshape(n, k))
  ys = _grouped_mlp(xs, group_sizes, ws, act)
  pair = jnp.pad(order, (0, rows - a), constant_values=a)
  y_ad = _gather_rows(ys, rank, pair[:, None])
  y_ad = jnp.where(is_local[:, None], y_ad, 0)
  return _combine(y_ad.reshape(n, k, -1), w_nk)


def receive_rows(num_pairs: int, ep: int, factor: float) -> int:
  """Rows of an expert shard's receive buffer for `num_pairs` sent per shard.

  `factor` x the mean load (every shard sends `num_pairs`, so a shard
  receives that many on average), at most the worst case (every pair to one
  shard: ep x num_pairs); `factor` <= 0 takes the worst case. A multiple of
  the grouped matmul's row tile.
  """
  worst = ep * num_pairs
  rows = worst if factor <= 0 else min(worst, math.ceil(factor * num_pairs))
  return ops.round_rows(max(rows, 1))


def overflow_chunks(num_tokens: int, top_k: int, ep: int, rows: int) -> int:
  """Token chunks small enough that no shard can receive more than `rows`."""
  per_chunk = max(rows // (ep * top_k), 1)
  return -(-num_tokens // per_chunk)


def _ragged_all_to_all(x_nd, idx_nk, w_nk, ws, act, expert_axes, tensor_axes,
                       *, emulated, buffer_factor):
  """`ragged` under expert parallelism: each pair travels to its expert's shard and back.

  The receive buffer holds `receive_rows` rows: `buffer_factor` x the mean
  load, not the worst case (ep x N x k rows, which grows with the expert
  axis), as MaxText's `ragged_buffer_factor`. Unlike MaxText's, it stays
  exact: every shard sees the whole [from, to] send matrix, so all of them
  know when some shard would receive more, and then (`lax.cond`, the same
  branch everywhere) the exchange runs over token chunks small enough that
  no shard can overflow, each chunk rematerialised in the backward pass, so
  memory stays bounded either way. The second output says which ran.
  """
  n, k = idx_nk.shape
  ep = _axis_size(expert_axes)
  rows = receive_rows(n * k, ep, buffer_factor)
  one = functools.partial(_exchange_once, ws=ws, act=act,
                          expert_axes=expert_axes, tensor_axes=tensor_axes,
                          emulated=emulated, rows=rows)
  if rows >= ep * n * k:
    return one(x_nd, idx_nk, w_nk), jnp.zeros((), bool)
  sizes = _send_matrix(idx_nk, ws[0].shape[0], expert_axes)
  overflow = jnp.max(jnp.sum(sizes, axis=0)) > rows   # the same on every shard
  chunks = overflow_chunks(n, k, ep, rows)

  def chunked():
    m = -(-n // chunks)
    pad = lambda v: jnp.pad(v, ((0, chunks * m - n),) + ((0, 0),) * (v.ndim - 1))
    xs, idx, w = (pad(v).reshape(chunks, m, *v.shape[1:])
                  for v in (x_nd, idx_nk, w_nk))
    body = jax.checkpoint(lambda c: one(*c))
    return jax.lax.map(body, (xs, idx, w)).reshape(chunks * m, -1)[:n]

  y = jax.lax.cond(overflow, chunked,
                   lambda: one(x_nd, idx_nk, w_nk, sizes=sizes))
  return y, overflow


def _send_matrix(idx_nk, e_loc: int, expert_axes):
  """[from, to] int32: the (token, choice) pairs each shard sends each shard."""
  ep = _axis_size(expert_axes)
  send = jnp.bincount(idx_nk.reshape(-1) // e_loc, length=ep).astype(jnp.int32)
  gather_axis = expert_axes if len(expert_axes) > 1 else expert_axes[0]
  return jax.lax.all_gather(send, gather_axis, axis=0, tiled=False)


def _exchange_once(x_nd, idx_nk, w_nk, *, ws, act, expert_axes, tensor_axes,
                   emulated, rows, sizes=None):
  """One exchange with a receive buffer of `rows` (the caller knows it fits);
  `sizes`: the `_send_matrix` of these pairs, if the caller has it."""
  n, k = idx_nk.shape
  d = x_nd.shape[-1]
  e_loc = ws[0].shape[0]
  a = n * k
  exchange = functools.partial(ops.ragged_all_to_all, axes=expert_axes,
                               emulated=emulated)
  e_flat = idx_nk.reshape(a)
  order = jnp.argsort(e_flat, stable=True)
  rank = jnp.zeros((a,), jnp.int32).at[order].set(jnp.arange(a, dtype=jnp.int32))
  xs = _gather_rows(x_nd, order // k, rank.reshape(n, k))
  e_sorted = e_flat[order]
  if sizes is None:
    sizes = _send_matrix(idx_nk, e_loc, expert_axes)
  me = ops.axis_index(expert_axes)
  send = sizes[me]
  in_off = jnp.cumsum(send) - send
  recv = sizes[:, me]
  out_off = (jnp.cumsum(sizes, axis=0) - sizes)[me]   # after earlier senders
  x_recv = exchange(xs, jnp.zeros((rows, d), xs.dtype), in_off, send, out_off,
                    recv)
  e_recv = exchange((e_sorted % e_loc).astype(jnp.int32),
                    jnp.full((rows,), e_loc, jnp.int32), in_off, send, out_off,
                    recv)
  order2 = jnp.argsort(e_recv, stable=True)          # empty rows sort last
  rank2 = jnp.zeros((rows,), jnp.int32).at[order2].set(
      jnp.arange(rows, dtype=jnp.int32))
  groups = jnp.bincount(e_recv, length=e_loc + 1)[:e_loc]
  xr = _gather_rows(x_recv, order2, rank2[:, None])
  yr = _grouped_mlp(xr, groups, ws, act)
  if tensor_axes:
    yr = jax.lax.psum(yr, tensor_axes)
  y_recv = _gather_rows(yr, rank2, order2[:, None])
  # Back: the chunk from sender i sits after the chunks of senders < i and
  # goes to where sender i took it from.
  back_in = jnp.cumsum(recv) - recv
  back_out = (jnp.cumsum(sizes, axis=1) - sizes)[:, me]
  ys = exchange(y_recv, jnp.zeros((a, d), y_recv.dtype), back_in, recv,
                back_out, send)
  y_ad = _gather_rows(ys, rank, order[:, None])
  return _combine(y_ad.reshape(n, k, -1), w_nk)


# --------------------------------------------------------------- capacity


def capacity(num_tokens: int, top_k: int, num_experts: int,
             factor: float) -> int:
  """Slots per expert (per source shard): ceil(factor * N * k / E)."""
  return max(1, math.ceil(factor * num_tokens * top_k / num_experts))


def _expert_of_pair(idx_nk, num_experts: int, valid_n=None):
  """[k * N] expert of each (token, choice) pair, choice-major; E for padding."""
  e_kn = idx_nk.T.reshape(-1)  # choice-major priority
  if valid_n is not None:      # padding sorts after every expert
    e_kn = jnp.where(jnp.tile(valid_n, idx_nk.shape[1]), e_kn, num_experts)
  return e_kn


def capacity_slots(idx_nk, num_experts: int, cap: int, valid_n=None):
  """Slot of each (token, choice) pair in an [E * C] buffer, and whether kept.

  First choices of all tokens take precedence over second choices, and so on
  (GShard); within a choice rank, earlier tokens first. A dropped pair gets
  slot E * C (the padding row). Tokens with `valid_n` False (padding) take
  no slot, so they never push a real token out of an expert.
  """
  n, k = idx_nk.shape
  e_kn = _expert_of_pair(idx_nk, num_experts, valid_n)
  order = jnp.argsort(e_kn, stable=True)
  counts = jnp.bincount(e_kn, length=num_experts + 1)
  starts = jnp.cumsum(counts) - counts
  rank_sorted = jnp.arange(n * k) - starts[e_kn[order]]
  rank = jnp.zeros((n * k,), jnp.int32).at[order].set(rank_sorted)
  keep = (rank < cap) & (e_kn < num_experts)
  slot = jnp.where(keep, e_kn * cap + rank, num_experts * cap)
  return slot.reshape(k, n).T, keep.reshape(k, n).T


def _capacity(x_nd, idx_nk, w_nk, ws, act, num_experts, cap, expert_axes,
              tensor_axes, valid_n=None):
  n, k = idx_nk.shape
  d = x_nd.shape[-1]
  slot_nk, keep_nk = capacity_slots(idx_nk, num_experts, cap, valid_n)
  num_slots = num_experts * cap
  # Which pair fills each slot (n*k+j, or n*k when empty), for the backward pass.
  pair_of_slot = jnp.full((num_slots + 1,), n * k, jnp.int32).at[
      slot_nk.reshape(-1)].set(jnp.arange(n * k, dtype=jnp.int32))[:num_slots]
  tok_of_slot = jnp.where(pair_of_slot < n * k, pair_of_slot // k, n)
  buf_ecd = _gather_rows(x_nd, tok_of_slot, slot_nk).reshape(num_experts, cap, d)

  ep = _axis_size(expert_axes)
  if ep > 1:
    # [E, C, D] = [ep, E_loc, C, D] by destination -> [ep (source), E_loc, C, D]
    buf = buf_ecd.reshape(ep, num_experts // ep, cap, d)
    buf = jax.lax.all_to_all(buf, expert_axes, 0, 0, tiled=True)
    buf_ecd = buf.transpose(1, 0, 2, 3).reshape(num_experts // ep, ep * cap, d)
  y_ecd = _expert_mlp_ecd(buf_ecd, *ws, act)
  if tensor_axes:
    y_ecd = jax.lax.psum(y_ecd, tensor_axes)
  if ep > 1:
    y = y_ecd.reshape(num_experts // ep, ep, cap, d).transpose(1, 0, 2, 3)
    y = jax.lax.all_to_all(y, expert_axes, 0, 0, tiled=True)
    y_ecd = y.reshape(num_experts, cap, d)
  y_pd = _gather_rows(y_ecd.reshape(num_slots, d), slot_nk.reshape(-1),
                      pair_of_slot[:, None])
  return _combine(y_pd.reshape(n, k, d), w_nk), keep_nk


def dropless(x_nd, idx_nk, w_nk, ws, act, num_experts, cap, expert_axes,
              tensor_axes, valid_n=None, *, dense=None):
  """`_capacity` when every expert's load fits `cap`, else dense: never drops.

  The test is taken over the expert axes (every shard of an all_to_all group
  must take the same branch). `dense` overrides the fallback (the decode
  path's pre-laid-out flat weights). Returns (y, kept pairs: all, whether
  the fallback ran).
  """
  load = jnp.bincount(_expert_of_pair(idx_nk, num_experts, valid_n),
                      length=num_experts + 1)[:num_experts]
  worst = jnp.max(load)
  if expert_axes:
    worst = jax.lax.pmax(worst, expert_axes)
  if dense is None:
    dense = lambda: _dense_path(x_nd, idx_nk, w_nk, ws, act, expert_axes,
                                tensor_axes)[0]
  blocks = lambda: _capacity(x_nd, idx_nk, w_nk, ws, act, num_experts, cap,
                             expert_axes, tensor_axes, valid_n)[0]
  y = jax.lax.cond(worst <= cap, blocks, dense)
  return y, jnp.ones(idx_nk.shape, bool), worst > cap


def quarter_power_ceil(n: int) -> int:
  """`n` rounded up to a quarter of its power of two (2^j + i 2^(j-2): ...,
  32, 40, 48, 56, 64, 80, ...): a few distinct sizes (each a compile where
  it is a shape), at most 25 % above `n`."""
  q = 2 ** max(int(n).bit_length() - 3, 0)
  return int(-(-n // q) * q)


def replay_capacity(expert_idx_btlk, valid_bt, num_experts: int, *,
                    headroom: float = 0.0) -> int:
  """Capacity (slots per expert) that drops nothing under a replayed routing.

  The largest number of real (token, choice) pairs any expert receives in
  any MoE layer of the batch (an upper bound for every shard of it too),
  times 1 + `headroom` (room for batches to come), rounded up to a quarter
  of its power of two (2^j + i 2^(j-2)), so that a run's updates see a few
  capacities, each compiled once, with at most 25 % of slots unused
  (beyond the headroom).

  Args:
    expert_idx_btlk: [B, T, L_moe, k] the routing to replay (numpy).
    valid_bt: [B, T] real tokens (segment id != 0); padding takes no slot.
    num_experts: E.
    headroom: the fraction of extra load to fit (>= 0).
  """
  e = np.asarray(expert_idx_btlk)
  valid = np.broadcast_to(np.asarray(valid_bt, bool)[:, :, None, None],
                          e.shape)
  if not valid.any():
    return 1
  layer = np.broadcast_to(np.arange(e.shape[2])[None, None, :, None], e.shape)
  load = np.bincount((layer * num_experts + e)[valid],
                     minlength=e.shape[2] * num_experts).max()
  return quarter_power_ceil(int(np.ceil(load * (1.0 + headroom))))


# `dropless`'s blocks: twice the mean load per expert, unless given more.
DROPLESS_CAPACITY_FACTOR = 2.0


# ------------------------------------------------------------------ entry


def expert_forward(x_nd, idx_nk, w_nk, ws, valid_n=None, *, act: str,
                   dispatch: str, num_experts: int, capacity_factor: float,
                   capacity_slots: int | None = None,
                   buffer_factor: float = 0.0,
                   expert_axes: Axes = (), tensor_axes: Axes = ()):
  """Weighted expert outputs for this shard's tokens.

  Args:
    x_nd: [N, D] this shard's tokens.
    idx_nk: [N, k] chosen experts (global ids); w_nk: [N, k] gate weights.
    ws: (w_gate [E_loc, D, F_loc], w_up or None, w_down [E_loc, F_loc, D]),
      this shard's experts (E_loc = E / expert-axis size) and width slice.
    valid_n: [N] bool, False for padding (takes no capacity slot); None:
      every token is real.
    dispatch: 'dense' | 'ragged' | 'capacity' | 'dropless'.
    capacity_slots: `capacity` / `dropless` slots per expert (per source
      shard) instead of `capacity_factor`'s (`dropless`: at least twice the
      mean load when neither is larger).
    buffer_factor: `ragged`'s expert-parallel receive buffer in multiples of
      the mean load (`receive_rows`; <= 0: the worst case).
    expert_axes / tensor_axes: mesh axes splitting experts / expert width.

  Returns:
    ([N, D] output, [N, k] bool: pair was computed, i.e. not dropped,
    [N] bool: the token's exact path left its bounded buffer for its
    fallback: `dropless`'s dense pass, `ragged`'s chunked exchange).
  """
  n, k = idx_nk.shape
  spilled = lambda flag: jnp.broadcast_to(flag, (n,))
  if dispatch in ('capacity', 'dropless'):
    factor = (capacity_factor if dispatch == 'capacity' else
              max(capacity_factor, DROPLESS_CAPACITY_FACTOR))
    cap = capacity_slots or capacity(n, k, num_experts, factor)
    if dispatch == 'capacity':
      y, keep = _capacity(x_nd, idx_nk, w_nk, ws, act, num_experts, cap,
                          expert_axes, tensor_axes, valid_n)
      return y, keep, spilled(False)
    y, keep, fell_back = dropless(x_nd, idx_nk, w_nk, ws, act, num_experts,
                                  cap, expert_axes, tensor_axes, valid_n)
    return y, keep, spilled(fell_back)
  y, fell_back = _dense_path(x_nd, idx_nk, w_nk, ws, act, expert_axes,
                             tensor_axes, ragged=dispatch == 'ragged',
                             buffer_factor=buffer_factor)
  return y, jnp.ones(idx_nk.shape, bool), spilled(fell_back)


def _dense_path(x_nd, idx_nk, w_nk, ws, act, expert_axes, tensor_axes, *,
                ragged=False, buffer_factor=0.0):
  """`dense` (or `ragged`): every pair computed, on one shard or over the
  expert axes: (y, whether a bounded buffer overflowed)."""
  local = _ragged_local if ragged else _dense_local
  ep = _axis_size(expert_axes)
  if ragged and ep > 1:
    exchange = ops.expert_exchange(x_nd.dtype)
    if exchange != 'all_gather':
      return _ragged_all_to_all(x_nd, idx_nk, w_nk, ws, act, expert_axes,
                                tensor_axes, buffer_factor=buffer_factor,
                                emulated=exchange.endswith('emulated'))
  no = jnp.zeros((), bool)
  if ep == 1:
    y = local(x_nd, idx_nk, w_nk, ws, act, 0)
    return (jax.lax.psum(y, tensor_axes) if tensor_axes else y), no
  # Portable expert parallelism: every shard sees the tokens of its expert
  # group, computes its own experts' share, and the shares are summed back
  # to the token owners.
  x_all = jax.lax.all_gather(x_nd, expert_axes, axis=0, tiled=True)
  idx_all = jax.lax.all_gather(idx_nk, expert_axes, axis=0, tiled=True)
  w_all = jax.lax.all_gather(w_nk, expert_axes, axis=0, tiled=True)
  first = ops.axis_index(expert_axes) * ws[0].shape[0]
  y_all = local(x_all, idx_all, w_all, ws, act, first)
  if tensor_axes:
    y_all = jax.lax.psum(y_all, tensor_axes)
  return jax.lax.psum_scatter(y_all, expert_axes, scatter_dimension=0,
                              tiled=True), no
