"""The decoder: embedding, a stack of pre-norm residual blocks from the pattern, output head."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax.model._attention import Attention
from cascade_jax.model._attention import attention_mask
from cascade_jax.model._attention import rope_tables
from cascade_jax.model._config import ATTENTION
from cascade_jax.model._config import MAMBA
from cascade_jax.model._config import MLP
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._config import MOE
from cascade_jax.model._layers import Mlp
from cascade_jax.model._layers import param
from cascade_jax.model._layers import RMSNorm
from cascade_jax.model import _mamba
from cascade_jax.model._mamba import Mamba2
from cascade_jax.model._mamba import MambaState
from cascade_jax.model._moe import ExpertBias
from cascade_jax.model._moe import MoE
from cascade_jax.model._moe import update_expert_bias
from cascade_jax.sharding import ShardingCtx


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Keys / values of every attention layer, plus per-slot position and segment.

  Slot s of row b holds a token at `positions[b, s]` in segment
  `segment_ids[b, s]` (0: empty or padding, never attended). New tokens are
  written at `index`, the same slot for every row; rows of different prompt
  lengths are left-padded with segment 0.
  """
  k: tuple[jax.Array, ...]         # per attention layer: [B, K, H, S]
  v: tuple[jax.Array, ...]         # per attention layer: [B, K, S, H]
  positions: jax.Array             # [B, S] int32
  segment_ids: jax.Array           # [B, S] int32
  index: jax.Array                 # [] int32, next slot to write
  # Per Mamba-2 layer: its conv inputs and SSM state after the last token
  # written (they do not grow with S).
  mamba: tuple[MambaState, ...] = ()

  @property
  def max_len(self) -> int:
    return self.positions.shape[1]

  def written(self, positions_bt, segment_ids_bt) -> tuple[jax.Array, jax.Array]:
    """(positions, segment_ids) [B, S] once T new tokens are written at `index`."""
    put = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(
        buf, x.astype(jnp.int32), self.index, axis=1)
    return put(self.positions, positions_bt), put(self.segment_ids,
                                                  segment_ids_bt)

  def last_segment(self) -> jax.Array:
    """[B] int32: the segment of the last token written (0 if none)."""
    prev = jax.lax.dynamic_index_in_dim(
        self.segment_ids, jnp.maximum(self.index - 1, 0), axis=1,
        keepdims=False)
    return jnp.where(self.index > 0, prev, 0)


def init_cache(cfg: ModelConfig, batch: int, max_len: int,
               dtype: str | None = None) -> KVCache:
  dt = jnp.dtype(dtype or cfg.dtype)
  n_attn = cfg.pattern.count(ATTENTION)
  k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, max_len)
  v_shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  return KVCache(
      k=tuple(jnp.zeros(k_shape, dt) for _ in range(n_attn)),
      v=tuple(jnp.zeros(v_shape, dt) for _ in range(n_attn)),
      positions=jnp.zeros((batch, max_len), jnp.int32),
      segment_ids=jnp.zeros((batch, max_len), jnp.int32),
      index=jnp.zeros((), jnp.int32),
      mamba=tuple(_mamba.init_state(cfg, batch, dt)
                  for _ in range(cfg.pattern.count(MAMBA))))


class Block(nnx.Module):
  """x + mixer(norm(x)), one mixer per layer as in Nemotron-H."""

  def __init__(self, kind: str, cfg: ModelConfig, *, rngs: nnx.Rngs,
               ctx: ShardingCtx | None):
    self.kind = kind
    pdt = jnp.dtype(cfg.param_dtype)
    self.norm = RMSNorm(cfg.embed_dim, eps=cfg.norm_eps, dtype=pdt)
    if kind == ATTENTION:
      self.mixer = Attention(cfg, rngs=rngs, ctx=ctx)
    elif kind == MOE:
      self.mixer = MoE(cfg, rngs=rngs, ctx=ctx)
    elif kind == MLP:
      self.mixer = Mlp(cfg.embed_dim, cfg.mlp_dim,
                       activation_name=cfg.mlp_activation, rngs=rngs, ctx=ctx,
                       dtype=pdt)
    elif kind == MAMBA:
      self.mixer = Mamba2(cfg, rngs=rngs, ctx=ctx)
    else:
      raise ValueError(f'pattern: unknown layer letter {kind!r}')


class Transformer(nnx.Module):
  """Decoder-only LM over a layer pattern such as '*E*E' (Qwen3-MoE) or 'MEM*E' (Nemotron-H)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               ctx: ShardingCtx | None = None):
    self.cfg = cfg
    self.ctx = ctx
    pdt = jnp.dtype(cfg.param_dtype)
    d, v = cfg.embed_dim, cfg.vocab_size
    self.embed_vd = param(rngs, (v, d), ('vocab', 'embed'), std=d ** -0.5,
                          dtype=pdt)
    self.blocks = nnx.List([Block(kind, cfg, rngs=rngs, ctx=ctx)
                            for kind in cfg.pattern])
    self.final_norm = RMSNorm(d, eps=cfg.norm_eps, dtype=pdt)
    self.head_dv = (None if cfg.tie_embeddings else
                    param(rngs, (d, v), ('embed', 'vocab'), dtype=pdt))

  def __call__(self, tokens_bt: jax.Array, *,
               positions_bt: jax.Array | None = None,
               segment_ids_bt: jax.Array | None = None,
               expert_idx: jax.Array | None = None,
               return_hidden: bool = False,
               moe_dispatch: str | None = None,
               moe_capacity: int | None = None,
               return_logits: bool = True,
               ) -> tuple[jax.Array | None, dict[str, Any]]:
    """Runs the model.

    Args:
      tokens_bt: [B, T] token ids.
      positions_bt: [B, T] positions (restart at 0 in each packed segment);
        default arange(T), or continuing the cache.
      segment_ids_bt: [B, T] packed-segment ids, 0 = padding; default 1.
      expert_idx: [B, T, L_moe, k] experts to use in each MoE layer instead
        of the router's choice (replaying a rollout's routing). Routing is
        batch-major everywhere outside the model; the layers run
        layer-major, and this call is where the two meet.
      return_hidden: also return the final normed hidden states.
      return_logits: False skips the output head (logits None, info has
        'hidden'): the losses then take the logits a chunk at a time
        (`logits`, `ModelConfig.logits_chunk`).
      moe_dispatch: overrides the MoE layers' configured dispatch path.
      moe_capacity: slots per expert for the `capacity` / `dropless` paths
        (e.g. `replay_capacity` of a replayed routing: then nothing drops).

    Returns:
      (logits [B, T, V] fp32, info) where info has 'aux_loss' (scalar sum of
      router aux losses), 'router' (per MoE layer stats stacked on axis 0:
      load [L, E], dropped [L], seq_aux [L], z_loss [L]), 'expert_idx'
      [B, T, L_moe, k], 'hidden'.

    The sampler's forward over a KV cache is `cascade_jax.rollout.forward`
    (the one cached forward): it computes this function, a token at a time.
    """
    cfg = self.cfg
    b, t = tokens_bt.shape
    if segment_ids_bt is None:
      segment_ids_bt = jnp.ones((b, t), jnp.int32)
    if positions_bt is None:
      positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    x = self.embed(tokens_bt)
    # Shared by every attention layer: computed once, not once per layer.
    rope_cs = (rope_tables(positions_bt, cfg.head_dim, cfg.rope_theta)
               if cfg.use_rope else None)
    mask = attention_mask(positions_bt, segment_ids_bt, positions_bt,
                          segment_ids_bt)
    shared = dict(positions_bt=positions_bt, segment_ids_bt=segment_ids_bt,
                  valid_bt=segment_ids_bt != 0, rope_cs=rope_cs, mask_bts=mask)
    if MAMBA in cfg.pattern:   # where the Mamba layers' state restarts
      shared['reset_bt'] = _mamba.resets(segment_ids_bt, None)
    moe = (moe_dispatch, moe_capacity)
    # [B, T, L_moe, k] -> [L_moe, B, T, k]: the layers' order, scanned or not.
    replay = None if expert_idx is None else jnp.moveaxis(expert_idx, 2, 0)
    if cfg.scan_layers and len(cfg.scan_unit) < cfg.num_layers:
      x, routers = self._scanned_blocks(x, shared, moe, replay)
    else:
      x, routers = self._unrolled_blocks(x, shared, moe, replay)

    x = self.final_norm(x)
    logits = self._head(x) if return_logits else None
    info: dict[str, Any] = {'aux_loss': jnp.zeros((), jnp.float32)}
    if routers:
      stacked = dict(routers)
      info['expert_idx'] = jnp.moveaxis(stacked.pop('expert_idx'), 0, 2)
      info['aux_loss'] = stacked.pop('aux_loss').sum()
      info['router'] = stacked
    if return_hidden or not return_logits:
      info['hidden'] = x
    return logits, info

  # ----------------------------------------------------------- the blocks

  def _unrolled_blocks(self, x, shared, moe, expert_idx_lbtk):
    """Every block in turn (each under the remat policy): (x, router stats)."""
    routers, n_moe = [], 0
    for blk in self.blocks:
      replay = None
      if blk.kind == MOE:
        replay = None if expert_idx_lbtk is None else expert_idx_lbtk[n_moe]
        n_moe += 1
      graph, state = nnx.split(blk)
      fn = functools.partial(_block_fn, graph, moe, self.ctx)
      x, stats = _remat(self.cfg.remat, fn)(state, x, replay, shared)
      if stats is not None:
        routers.append(stats)
    return x, _stack_stats(routers)

  def _scanned_blocks(self, x, shared, moe, expert_idx_lbtk):
    """The pattern's repeating unit under one `lax.scan` over its repeats.

    The weights stay one module per layer (checkpoints, the sampler and the
    Hugging Face mapping see the same tree either way); the scan stacks
    each unit position's weights [repeats, ...] as its input, so the unit
    compiles once however deep the model is.
    """
    cfg = self.cfg
    p = len(cfg.scan_unit)
    n = cfg.num_layers // p
    graphs, stacked = [], []
    for j in range(p):
      graphs.append(nnx.graphdef(self.blocks[j]))
      stacked.append(jax.tree.map(lambda *xs: jnp.stack(xs), *[
          nnx.state(self.blocks[i * p + j]) for i in range(n)]))
    m = cfg.scan_unit.count(MOE)
    replay = (None if expert_idx_lbtk is None else
              expert_idx_lbtk.reshape(n, m, *expert_idx_lbtk.shape[1:]))

    def unit(x, xs):
      states, replay_i = xs
      routers = []
      for j in range(p):
        r = None
        if cfg.scan_unit[j] == MOE and replay_i is not None:
          r = replay_i[len(routers)]
        x, stats = _block_fn(graphs[j], moe, self.ctx, states[j], x, r,
                             shared)
        if stats is not None:
          routers.append(stats)
      return x, _stack_stats(routers)

    x, routers = jax.lax.scan(_remat(cfg.remat, unit), x, (stacked, replay))
    # [repeats, MoE per unit, ...] -> [MoE layers, ...] in layer order.
    return x, {k: v.reshape(-1, *v.shape[2:]) for k, v in routers.items()}

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    """Token embeddings [B, T, D] in the compute dtype."""
    table = self.embed_vd[...]
    if self.ctx is not None:
      # FSDP-style: gather the table before the lookup, so that the lookup's
      # output can follow the batch sharding (a sharded-table gather cannot).
      table = self.ctx.constrain(table, (None, None))
    x = jnp.take(table, tokens_bt, axis=0).astype(jnp.dtype(self.cfg.dtype))
    return self.constrain(x)

  def logits(self, hidden_btd: jax.Array) -> jax.Array:
    """The output head on final normed hidden states: logits [B, T, V] fp32."""
    return self._head(hidden_btd)

  def unembed(self, x_btd: jax.Array) -> jax.Array:
    """Final norm and output head: logits [B, T, V] fp32."""
    return self._head(self.final_norm(x_btd))

  def _head(self, x_btd):
    b, t, d = x_btd.shape
    head = (self.embed_vd[...].T if self.head_dv is None else self.head_dv[...])
    logits = x_btd.reshape(b * t, d) @ head.astype(x_btd.dtype)
    return logits.reshape(b, t, -1).astype(jnp.float32)

  def constrain(self, x_btd):
    """Residual-stream activations [B, T, D] sharded by batch (no-op unsharded)."""
    if self.ctx is None:
      return x_btd
    return self.ctx.constrain(x_btd, ('batch', 'seq', None))

  def moe_layers(self) -> list[MoE]:
    return [blk.mixer for blk in self.blocks if blk.kind == MOE]

  def update_expert_biases(self, load_le: jax.Array, rate: float) -> None:
    """Applies the aux-loss-free balancing step to every MoE layer (in place).

    `load_le` is info['router']['load'] from a forward pass; run this outside
    the optimizer, once per training step.
    """
    for moe, load in zip(self.moe_layers(), load_le):
      if moe.expert_bias is not None:
        moe.expert_bias[...] = update_expert_bias(moe.expert_bias[...], load,
                                                  rate)


def _block_fn(graph, moe, ctx, state, x, replay, shared):
  """One block as a function of its state: (x, router stats or None).

  Past the static (graph, (MoE dispatch, capacity), sharding) a function of
  arrays, so that it runs under `jax.checkpoint` and as a `lax.scan` body.
  """
  blk = nnx.merge(graph, state)
  b, t, _ = x.shape
  h = blk.norm(x)
  stats = None
  if blk.kind == ATTENTION:
    h, _ = blk.mixer(h, positions_bt=shared['positions_bt'],
                     segment_ids_bt=shared['segment_ids_bt'],
                     rope_cs=shared['rope_cs'], mask_bts=shared['mask_bts'])
  elif blk.kind == MOE:
    h, stats = blk.mixer(h, valid_bt=shared['valid_bt'], expert_idx_btk=replay,
                         dispatch=moe[0], capacity=moe[1])
  elif blk.kind == MAMBA:
    h, _ = blk.mixer(h, reset_bt=shared['reset_bt'])
  else:
    h = blk.mixer(h.reshape(b * t, -1)).reshape(b, t, -1)
  x = x + h
  if ctx is not None:
    x = ctx.constrain(x, ('batch', 'seq', None))
  return x, stats


_REMAT = {
    'full': None,
    'save_dots': jax.checkpoint_policies.dots_saveable,
    'save_dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _remat(policy: str, fn):
  return fn if policy == 'none' else jax.checkpoint(fn, policy=_REMAT[policy])


def _stack_stats(routers: list[dict]) -> dict:
  """Per-MoE-layer stats stacked on a new leading axis ({} without MoE)."""
  if not routers:
    return {}
  return {k: jnp.stack([r[k] for r in routers]) for k in routers[0]}


def dropped_fraction(info) -> jax.Array:
  """The mean over MoE layers of a forward's dropped (token, choice) fraction.

  `info` is `Transformer.__call__`'s; 0 for a model without MoE layers.
  """
  if 'router' not in info:
    return jnp.zeros((), jnp.float32)
  return jnp.mean(info['router']['dropped'])


def spilled_fraction(info) -> jax.Array:
  """The mean over MoE layers of the fraction of tokens whose exact dispatch
  left its bounded buffer for its (exact, slower) fallback; 0 without MoE."""
  if 'router' not in info:
    return jnp.zeros((), jnp.float32)
  return jnp.mean(info['router']['spilled'])


__all__ = ['ExpertBias', 'KVCache', 'Transformer', 'dropped_fraction',
           'spilled_fraction',
           'init_cache']
