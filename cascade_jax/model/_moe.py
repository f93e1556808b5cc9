"""Mixture-of-experts FFN: router, aux-loss-free bias, routing replay, expert dispatch."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from cascade_jax.model import _dispatch
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._layers import is_gated
from cascade_jax.model._layers import Mlp
from cascade_jax.model._layers import param
from cascade_jax.sharding import ShardingCtx


class ExpertBias(nnx.Variable):
  """Aux-loss-free balancing bias. Not an nnx.Param: optimizers never see it."""


def route(logits_ne: jax.Array, *, score_fn: str, top_k: int,
          renormalize: bool, routed_scale: float,
          bias_e: jax.Array | None = None,
          expert_idx_nk: jax.Array | None = None):
  """Chooses experts and their gate weights.

  The bias (if any) only shifts which experts are chosen; gate weights are
  the unbiased scores of the chosen experts (renormalised to sum to 1 if
  asked), times `routed_scale`. With `expert_idx_nk` given, those experts are
  used instead of the top-k (routing replay).

  Returns:
    (scores [N, E], idx [N, k] int32, weights [N, k]).
  """
  logits_ne = logits_ne.astype(jnp.float32)
  if score_fn == 'softmax':
    scores = jax.nn.softmax(logits_ne, axis=-1)
  else:
    scores = jax.nn.sigmoid(logits_ne)
  if expert_idx_nk is None:
    choice = scores if bias_e is None else scores + bias_e
    _, idx = jax.lax.top_k(choice, top_k)
  else:
    idx = expert_idx_nk
  idx = idx.astype(jnp.int32)
  w = jnp.take_along_axis(scores, idx, axis=-1)
  if renormalize:
    w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
  return scores, idx, w * routed_scale


def router_stats(logits_bte, scores_bte, idx_btk, valid_bt, keep_btk,
                 spilled_bt=None, *, num_experts: int, top_k: int):
  """Expert load, dropped and spilled fractions, sequence aux loss and z-loss (unscaled).

  spilled: the fraction of real tokens whose exact dispatch left its bounded
  buffer for its fallback (`dropless`'s dense pass, `ragged`'s chunked
  exchange): exact, but slower; a run that spills often wants a larger
  buffer (`capacity_factor`, `ragged_buffer_factor`).

  seq_aux (DeepSeek-V3): per sequence, sum_e f_e * p_e with
  f_e = E / (k T) * (#tokens choosing e) and p_e = mean_t of the normalised
  scores; averaged over sequences. Padding tokens (valid = False) do not count.
  """
  valid = valid_bt.astype(jnp.float32)
  onehot = jax.nn.one_hot(idx_btk, num_experts, dtype=jnp.float32)  # [B,T,k,E]
  counts_be = jnp.einsum('btke,bt->be', onehot, valid)
  n_valid_b = jnp.maximum(valid.sum(-1), 1.0)
  load = counts_be.sum(0) / jnp.maximum(counts_be.sum(), 1.0)
  norm_scores = scores_bte / (scores_bte.sum(-1, keepdims=True) + 1e-20)
  p_be = jnp.einsum('bte,bt->be', norm_scores, valid) / n_valid_b[:, None]
  f_be = counts_be * num_experts / (top_k * n_valid_b[:, None])
  seq_aux = jnp.mean(jnp.sum(f_be * p_be, axis=-1))
  z = jax.nn.logsumexp(logits_bte.astype(jnp.float32), axis=-1)
  z_loss = jnp.sum(jnp.square(z) * valid) / jnp.maximum(valid.sum(), 1.0)
  dropped = jnp.sum((1.0 - keep_btk.astype(jnp.float32)) * valid[..., None]) / (
      jnp.maximum(valid.sum(), 1.0) * top_k)
  if spilled_bt is None:
    spilled_bt = jnp.zeros(valid_bt.shape, bool)
  spilled = jnp.sum(spilled_bt.astype(jnp.float32) * valid) / jnp.maximum(
      valid.sum(), 1.0)
  return dict(load=load, dropped=dropped, spilled=spilled, seq_aux=seq_aux,
              z_loss=z_loss)


class MoE(nnx.Module):
  """Routed experts (+ optional shared expert) with a pluggable dispatch path."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               ctx: ShardingCtx | None = None):
    m = cfg.moe
    d, e, f = cfg.embed_dim, m.num_experts, m.expert_dim
    pdt = jnp.dtype(cfg.param_dtype)
    self.cfg = m
    self.ctx = ctx
    self.router_de = param(rngs, (d, e), ('embed', None), dtype=jnp.float32)
    self.expert_bias = (ExpertBias(jnp.zeros((e,), jnp.float32),
                                   logical_axes=(None,))
                        if m.use_expert_bias else None)
    self.w_gate_edf = param(rngs, (e, d, f), ('exp', 'embed', 'mlp'),
                            std=d ** -0.5, dtype=pdt)
    self.w_up_edf = (param(rngs, (e, d, f), ('exp', 'embed', 'mlp'),
                           std=d ** -0.5, dtype=pdt)
                     if is_gated(m.activation) else None)
    self.w_down_efd = param(rngs, (e, f, d), ('exp', 'mlp', 'embed'),
                            std=f ** -0.5, dtype=pdt)
    self.shared = (Mlp(d, m.num_shared_experts * m.shared_expert_dim,
                       activation_name=m.activation, rngs=rngs, ctx=ctx,
                       dtype=pdt)
                   if m.num_shared_experts else None)

  def __call__(self, x_btd: jax.Array, *, valid_bt: jax.Array | None = None,
               expert_idx_btk: jax.Array | None = None,
               with_stats: bool = True,
               dispatch: str | None = None,
               capacity: int | None = None,
               ) -> tuple[jax.Array, dict[str, Any]]:
    """Returns (y [B, T, D], router info: stats, aux losses, expert_idx [B, T, k]).

    With `with_stats=False` the info holds only expert_idx; `dispatch`
    overrides the configured path and `capacity` the capacity paths' slots
    per expert.
    """
    m = self.cfg
    b, t, d = x_btd.shape
    x_nd = x_btd.reshape(b * t, d)
    replay = None if expert_idx_btk is None else expert_idx_btk.reshape(b * t, -1)
    logits, scores, idx_nk, w_nk = self.route_tokens(x_nd, replay)
    valid_n = None if valid_bt is None else valid_bt.reshape(b * t)
    y_nd, keep_nk, spilled_n = self.experts(x_nd, idx_nk, w_nk, valid_n,
                                            dispatch=dispatch,
                                            capacity=capacity)
    if self.shared is not None:
      y_nd = y_nd + self.shared(x_nd)

    if not with_stats:
      return y_nd.reshape(b, t, d), {'expert_idx': idx_nk.reshape(b, t, -1)}
    if valid_bt is None:
      valid_bt = jnp.ones((b, t), bool)
    stats = router_stats(
        logits.reshape(b, t, -1), scores.reshape(b, t, -1),
        idx_nk.reshape(b, t, -1), valid_bt, keep_nk.reshape(b, t, -1),
        spilled_n.reshape(b, t), num_experts=m.num_experts, top_k=m.top_k)
    stats['aux_loss'] = (m.seq_aux_loss_coef * stats['seq_aux'] +
                         m.z_loss_coef * stats['z_loss'])
    stats['expert_idx'] = idx_nk.reshape(b, t, -1)
    return y_nd.reshape(b, t, d), stats

  def route_tokens(self, x_nd: jax.Array, expert_idx_nk: jax.Array | None = None):
    """The router on tokens [N, D]: (logits [N, E], scores, idx [N, k], weights [N, k])."""
    m = self.cfg
    logits = x_nd.astype(jnp.float32) @ self.router_de[...]
    bias = None if self.expert_bias is None else self.expert_bias[...]
    scores, idx_nk, w_nk = route(
        logits, score_fn=m.score_fn, top_k=m.top_k, renormalize=m.renormalize,
        routed_scale=m.routed_scale, bias_e=bias, expert_idx_nk=expert_idx_nk)
    return logits, scores, idx_nk, w_nk

  def expert_weights(self, dt):
    """(w_gate [E, D, F], w_up or None, w_down [E, F, D]) in dtype `dt`."""
    return (self.w_gate_edf[...].astype(dt),
            None if self.w_up_edf is None else self.w_up_edf[...].astype(dt),
            self.w_down_efd[...].astype(dt))

  def experts(self, x_nd, idx_nk, w_nk, valid_n=None, *,
              dispatch: str | None = None, capacity: int | None = None):
    """The routed experts on tokens [N, D]: ([N, D], [N, k] kept, [N] spilled), sharded if the model is."""
    return self._experts(x_nd, idx_nk, w_nk, self.expert_weights(x_nd.dtype),
                         valid_n, dispatch or self.cfg.dispatch, capacity)

  def _experts(self, x_nd, idx_nk, w_nk, ws, valid_n, dispatch, capacity):
    m = self.cfg
    fn = functools.partial(
        _dispatch.expert_forward, act=m.activation, dispatch=dispatch,
        num_experts=m.num_experts, capacity_factor=m.capacity_factor,
        capacity_slots=capacity, buffer_factor=m.ragged_buffer_factor)
    if self.ctx is None:
      return fn(x_nd, idx_nk, w_nk, ws, valid_n)

    ctx = self.ctx
    batch_axes = ctx.mesh_axes('batch')
    w_spec = ctx.spec(('exp', None, 'mlp'), ws[0].shape)
    down_spec = ctx.spec(('exp', 'mlp', None), ws[2].shape)
    expert_axes = _spec_axes(w_spec[0])
    tensor_axes = _spec_axes(w_spec[2])
    if not set(expert_axes) <= set(batch_axes):
      raise ValueError(
          f'expert parallelism over {expert_axes} needs tokens split over it '
          f"too: add it to the 'batch' rule (now {batch_axes})")
    tok = P(batch_axes or None)
    fn = functools.partial(fn, expert_axes=expert_axes, tensor_axes=tensor_axes)
    in_specs = (tok, tok, tok,
                (w_spec, None if ws[1] is None else w_spec, down_spec),
                None if valid_n is None else tok)
    # check_vma=False: the Pallas grouped matmuls (tokamax, on GPU / TPU)
    # declare outputs without the varying-axes annotation the check needs;
    # the sharded tests hold values and gradients to one device's.
    return jax.shard_map(fn, mesh=ctx.mesh, in_specs=in_specs,
                         out_specs=(tok, tok, tok), check_vma=False)(
                             x_nd, idx_nk, w_nk, ws, valid_n)


def exact_dispatch(cfg: ModelConfig, expert_idx_btlk=None, valid_bt=None, *,
                   min_capacity: int = 0, headroom: float = 0.0
                   ) -> dict[str, Any]:
  """`Transformer` keyword arguments for a forward that drops no token.

  A forward that scores a rollout (learner, reference, teacher, reward
  model) must compute what the sampler computed, whatever else is in the
  batch. `dense`, `ragged` and `dropless` never drop; `capacity` would, so
  with a replayed routing (numpy `expert_idx_btlk` [B, T, L_moe, k] and
  `valid_bt` [B, T]) it gets a capacity that fits it (`replay_capacity`:
  exact at `capacity`'s cost; at least `min_capacity`: a run that passes
  its largest capacity so far compiles again only when a batch needs more;
  `headroom`: room for that much more load, `replay_capacity`'s), and
  without one it runs `dropless`.
  """
  if cfg.moe is None or cfg.moe.dispatch != 'capacity':
    return {}
  if expert_idx_btlk is None:
    return dict(moe_dispatch='dropless')
  return dict(moe_dispatch='capacity',
              moe_capacity=max(min_capacity, _dispatch.replay_capacity(
                  expert_idx_btlk, valid_bt, cfg.moe.num_experts,
                  headroom=headroom)))


def _spec_axes(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def update_expert_bias(bias_e: jax.Array, load_e: jax.Array,
                       rate: float) -> jax.Array:
  """Aux-loss-free balancing step: raise under-loaded experts' bias, lower over-loaded.

  bias_e <- bias_e + rate * sign(mean(load) - load_e)   (DeepSeek-V3)
  """
  return bias_e + rate * jnp.sign(jnp.mean(load_e) - load_e)
