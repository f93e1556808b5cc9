"""The decoder: embedding, a stack of pre-norm residual blocks from the pattern, output head."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from cascade_jax import ops

from cascade_jax.model._attention import Attention
from cascade_jax.model._attention import attention_mask
from cascade_jax.model._attention import rope_tables
from cascade_jax.model._config import ATTENTION
from cascade_jax.model._config import MAMBA
from cascade_jax.model._config import MLP
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._config import MOE
from cascade_jax.model._layer_arrays import stack_layers
from cascade_jax.model._layers import Mlp
from cascade_jax.model._layers import param
from cascade_jax.model._layers import RMSNorm
from cascade_jax.model import _mamba
from cascade_jax.model._mamba import Mamba2
from cascade_jax.model._mamba import MambaState
from cascade_jax.model._moe import ExpertBias
from cascade_jax.model._moe import MoE
from cascade_jax.model._moe import update_expert_bias
from cascade_jax.sharding import abstract_state
from cascade_jax.sharding import ShardingCtx


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Keys / values of every attention layer, plus per-slot position and segment.

  Slot s of row b holds a token at `positions[b, s]` in segment
  `segment_ids[b, s]` (0: empty or padding, never attended). New tokens are
  written at `index`: one slot for every row ([], rows of different prompt
  lengths left-padded with segment 0), or each row its own ([B]: continuous
  batching, where a row's sequence starts whenever its slot is refilled).
  """
  k: tuple[jax.Array, ...]         # per attention layer: [B, K, H, S]
  v: tuple[jax.Array, ...]         # per attention layer: [B, K, S, H]
  positions: jax.Array             # [B, S] int32
  segment_ids: jax.Array           # [B, S] int32
  index: jax.Array                 # [] or [B] int32, next slot to write
  # Per Mamba-2 layer: its conv inputs and SSM state after the last token
  # written (they do not grow with S).
  mamba: tuple[MambaState, ...] = ()

  @property
  def max_len(self) -> int:
    return self.positions.shape[1]

  def written(self, positions_bt, segment_ids_bt) -> tuple[jax.Array, jax.Array]:
    """(positions, segment_ids) [B, S] once T new tokens are written at `index`."""
    put = lambda buf, x: ops.write_at(buf, x.astype(jnp.int32), self.index, axis=1)
    return put(self.positions, positions_bt), put(self.segment_ids,
                                                  segment_ids_bt)

  def last_segment(self) -> jax.Array:
    """[B] int32: the segment of the last token written (0 if none)."""
    last = jnp.maximum(self.index - 1, 0)
    if jnp.ndim(self.index):
      prev = jnp.take_along_axis(self.segment_ids, last[:, None], axis=1)[:, 0]
    else:
      prev = jax.lax.dynamic_index_in_dim(self.segment_ids, last, axis=1,
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


def _stacked(var: nnx.Variable, *others: nnx.Variable) -> nnx.Variable:
  """`var` with the values of `var, *others` stacked on a new 'layers' axis."""
  axes = ('layers',) + tuple(var.get_metadata()['logical_axes'])
  return var.replace(jnp.stack([v[...] for v in (var,) + others]),
                     logical_axes=axes)


def _sliced(var: nnx.Variable, k: int) -> nnx.Variable:
  """`var`'s layer `k` (dropping the 'layers' axis); shapes stay shapes."""
  axes = tuple(var.get_metadata()['logical_axes'])[1:]
  value = var.get_value()
  if isinstance(value, jax.ShapeDtypeStruct):
    value = jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
  else:
    value = value[k]
  return var.replace(value, logical_axes=axes)


_is_var = lambda x: isinstance(x, nnx.Variable)


class Stack(nnx.Module):
  """`repeats` repeats of a unit of layers (MaxText's scanned layout).

  `blocks[j]` is the unit's j-th layer kind as one Block whose variables
  have a leading 'layers' axis of size `repeats`: a `lax.scan` runs over
  them as they are stored, with nothing re-stacked per step.
  """

  def __init__(self, unit: str, per_layer: list[Block]):
    p = len(unit)
    self.unit = unit
    self.repeats = len(per_layer) // p
    self.blocks = nnx.List([
        self._stack(per_layer[j::p]) for j in range(p)])

  @staticmethod
  def _stack(blocks: list[Block]) -> Block:
    graph, state = nnx.split(blocks[0])
    states = [nnx.state(b) for b in blocks[1:]]
    return nnx.merge(graph, jax.tree.map(_stacked, state, *states,
                                         is_leaf=_is_var))

  def layer(self, j: int, k: int) -> Block:
    """Position `j`, repeat `k` as a Block of its own (a view: reads only)."""
    graph, state = nnx.split(self.blocks[j])
    return nnx.merge(graph, jax.tree.map(lambda v: _sliced(v, k), state,
                                         is_leaf=_is_var))


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
    # Built a layer at a time in pattern order (the same random init as one
    # module per layer), then stored stacked: `layers[g]` is group g of
    # `cfg.layer_groups`, a Stack.
    per_layer = [Block(kind, cfg, rngs=rngs, ctx=ctx) for kind in cfg.pattern]
    self.layers = nnx.List()
    first = 0
    for unit, repeats in cfg.layer_groups:
      n = len(unit) * repeats
      self.layers.append(Stack(unit, per_layer[first:first + n]))
      first += n
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
    routers, first = [], 0
    for stack in self.layers:
      m = stack.unit.count(MOE) * stack.repeats
      rep = None if replay is None else replay[first:first + m]
      run = (self._scanned if cfg.scan_layers and stack.repeats > 1 else
             self._unrolled)
      x, stats = run(stack, x, shared, moe, rep)
      routers.append(stats)
      first += m
    routers = {k: jnp.concatenate([r[k] for r in routers])
               for k in routers[0]} if first else {}

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

  def _unrolled(self, stack, x, shared, moe, expert_idx_lbtk):
    """A group's layers in turn (each under the remat policy): (x, router stats).

    Each layer's weights are its slice of the stacked variables (a group
    repeated once: the whole array, reshaped).
    """
    routers = []
    graphs_states = [nnx.split(blk) for blk in stack.blocks]
    for k in range(stack.repeats):
      for j, (graph, state) in enumerate(graphs_states):
        replay = None
        if stack.unit[j] == MOE and expert_idx_lbtk is not None:
          replay = expert_idx_lbtk[len(routers)]
        # Layer k of each variable: a slice of its [L, ...] array, or its
        # own array where the weights are held a layer at a time.
        layer = jax.tree.map(lambda v, k=k: v.replace(v.get_value()[k]),
                             state, is_leaf=_is_var)
        fn = functools.partial(_block_fn, graph, moe, self.ctx)
        x, stats = _remat(self.cfg.remat, fn)(layer, x, replay, shared)
        if stats is not None:
          routers.append(stats)
    return x, _stack_stats(routers)

  def _scanned(self, stack, x, shared, moe, expert_idx_lbtk):
    """A group's unit under one `lax.scan` over its repeats: (x, router stats).

    The scan reads the stacked weights as they are stored: the unit
    compiles once however deep the model is, and its gradient comes back
    stacked the same way.
    """
    unit, n = stack.unit, stack.repeats
    graphs, stacked = zip(*(nnx.split(blk) for blk in stack.blocks))
    stacked = [stack_layers(s) for s in stacked]   # a layer at a time: one copy
    m = unit.count(MOE)
    replay = (None if expert_idx_lbtk is None else
              expert_idx_lbtk.reshape(n, m, *expert_idx_lbtk.shape[1:]))

    def body(x, xs):
      states, replay_i = xs
      routers = []
      for j, kind in enumerate(unit):
        r = None
        if kind == MOE and replay_i is not None:
          r = replay_i[len(routers)]
        x, stats = _block_fn(graphs[j], moe, self.ctx, states[j], x, r,
                             shared)
        if stats is not None:
          routers.append(stats)
      return x, _stack_stats(routers)

    x, routers = jax.lax.scan(_remat(self.cfg.remat, body), x,
                              (list(stacked), replay))
    # [repeats, MoE per unit, ...] -> [MoE layers, ...] in layer order.
    return x, {k: v.reshape(-1, *v.shape[2:]) for k, v in routers.items()}

  # --------------------------------------------------- the layers one by one

  def layer(self, i: int) -> Block:
    """Layer `i` of the pattern as a Block of its own: a view of its slice
    of the stacked weights, for reading (the sampler, exports)."""
    g, j, k = self.cfg.layer_slots[i]
    return self.layers[g].layer(j, k)

  def layer_views(self) -> list[Block]:
    """Every layer as `layer(i)`, in pattern order."""
    return [self.layer(i) for i in range(self.cfg.num_layers)]

  def set_layers(self, views: list[Block]) -> None:
    """Stores one Block per layer (pattern order, `layer_views`' layout)
    into the stacked weights, in place: how importers fill the model."""
    if [v.kind for v in views] != list(self.cfg.pattern):
      raise ValueError(f'set_layers: {len(views)} layers '
                       f"{''.join(v.kind for v in views)!r} do not match the "
                       f'pattern {self.cfg.pattern!r}')
    first = 0
    for stack in self.layers:
      p = len(stack.unit)
      mine = views[first:first + p * stack.repeats]
      for j, blk in enumerate(stack.blocks):
        states = [nnx.state(v) for v in mine[j::p]]
        nnx.update(blk, jax.tree.map(_stacked, *states, is_leaf=_is_var))
      first += p * stack.repeats

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    """Token embeddings [B, T, D] in the compute dtype."""
    table, dtype = self.embed_vd[...], jnp.dtype(self.cfg.dtype)
    if self.ctx is None:
      return jnp.take(table, tokens_bt, axis=0).astype(dtype)
    vocab = self.ctx.mesh_axes('vocab')
    if vocab and self.ctx.spec(('vocab', None), table.shape)[0] is not None \
        and not set(vocab) & set(self.ctx.mesh_axes('batch')):
      return self.constrain(vocab_parallel_take(self.ctx, table, tokens_bt,
                                                dtype))
    # FSDP-style: gather the table before the lookup, so that the lookup's
    # output can follow the batch sharding (a sharded-table gather cannot).
    table = self.ctx.constrain(table, (None, None))
    return self.constrain(jnp.take(table, tokens_bt, axis=0).astype(dtype))

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
    """Every MoE layer's mixer, in order (views: for reading; write the
    expert biases with `set_expert_biases`)."""
    return [blk.mixer for blk in self.layer_views() if blk.kind == MOE]

  def _moe_slots(self):
    """(stacked MoE mixer, its layers' indices among the MoE layers)."""
    order = [slot for slot, kind in zip(self.cfg.layer_slots, self.cfg.pattern)
             if kind == MOE]
    for g, stack in enumerate(self.layers):
      for j, kind in enumerate(stack.unit):
        if kind == MOE:
          yield stack.blocks[j].mixer, [order.index((g, j, k))
                                        for k in range(stack.repeats)]

  def expert_biases(self) -> jax.Array:
    """[L_moe, E]: every MoE layer's expert bias, in layer order."""
    out = [None] * self.cfg.pattern.count(MOE)
    for moe, idx in self._moe_slots():
      for k, i in enumerate(idx):
        out[i] = moe.expert_bias[k]
    return jnp.stack(out)

  def set_expert_biases(self, bias_le) -> None:
    """Sets every MoE layer's expert bias from [L_moe, E] (in place)."""
    bias_le = jnp.asarray(bias_le)
    for moe, idx in self._moe_slots():
      moe.expert_bias[...] = bias_le[jnp.asarray(idx)].astype(
          moe.expert_bias.dtype)

  def update_expert_biases(self, load_le: jax.Array, rate: float) -> None:
    """Applies the aux-loss-free balancing step to every MoE layer (in place).

    `load_le` is info['router']['load'] from a forward pass; run this outside
    the optimizer, once per training step.
    """
    for moe, idx in self._moe_slots():
      if moe.expert_bias is not None:
        moe.expert_bias[...] = jax.vmap(update_expert_bias, (0, 0, None))(
            moe.expert_bias[...], load_le[jnp.asarray(idx)], rate)


def abstract_model(cfg: ModelConfig, ctx: ShardingCtx | None = None
                   ) -> Transformer:
  """A Transformer of ShapeDtypeStructs, sharded by the rules on `ctx`: what
  a checkpoint or an import fills, with nothing allocated."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx))
  nnx.update(model, abstract_state(ctx, nnx.state(model)))
  return model


def init_model(cfg: ModelConfig, seed: int,
               ctx: ShardingCtx | None = None) -> Transformer:
  """A freshly initialised model, initialised under `jit`. On a mesh, with
  the rules' output shardings: every device computes only its own shards,
  so none ever holds a whole weight (a 30B model's 122 GB of fp32 fit no
  chip). One device and every mesh get the same values (the same program;
  eager op-by-op init differs from it in the last bits)."""
  graph, shapes = nnx.split(abstract_model(cfg, ctx))
  shardings = (None if ctx is None else
               jax.tree.map(lambda x: x.sharding, shapes))

  @functools.partial(jax.jit, out_shardings=shardings)
  def init():
    return nnx.state(Transformer(cfg, rngs=nnx.Rngs(seed), ctx=ctx))

  return nnx.merge(graph, init())


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


__all__ = ['ExpertBias', 'KVCache', 'Stack', 'Transformer', 'dropped_fraction',
           'spilled_fraction',
           'init_cache']


def vocab_parallel_take(ctx: ShardingCtx, table_vd: jax.Array,
                        tokens_bt: jax.Array, dtype) -> jax.Array:
  """The embedding lookup with the table's vocabulary kept split (Megatron's
  vocab-parallel embedding): each vocab shard looks up the tokens in its
  own rows, the others give zeros, and a sum over the vocab axes puts each
  token's row together. Exact (one non-zero term per element); what moves
  is [B, T, D] activations, not the [V, D] table, which the gathering
  lookup all-gathers over the vocab (tensor) axes at every step. The
  table's other dimension is gathered as before (FSDP's gather; none in
  the inference layout)."""
  vocab = ctx.mesh_axes('vocab')
  rows = table_vd.shape[0] // math.prod(ctx.axis_size(a) for a in vocab)
  tok_spec = ctx.spec(('batch', 'seq'), tokens_bt.shape)

  def local(table, tokens):
    shard = 0
    for a in vocab:                       # row-major over the vocab axes
      shard = shard * ctx.axis_size(a) + jax.lax.axis_index(a)
    at = tokens - shard * rows
    mine = (at >= 0) & (at < rows)
    x = jnp.take(table, jnp.clip(at, 0, rows - 1), axis=0).astype(dtype)
    return jax.lax.psum(jnp.where(mine[..., None], x, jnp.zeros_like(x)),
                        vocab)

  return jax.shard_map(
      local, mesh=ctx.mesh,
      in_specs=(P(vocab if len(vocab) > 1 else vocab[0], None), tok_spec),
      out_specs=P(*tok_spec, None))(table_vd, tokens_bt)
