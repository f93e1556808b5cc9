"""The decoder: embedding, a stack of pre-norm residual blocks from the pattern, output head."""

from __future__ import annotations

import dataclasses
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

  @property
  def max_len(self) -> int:
    return self.positions.shape[1]

  def written(self, positions_bt, segment_ids_bt) -> tuple[jax.Array, jax.Array]:
    """(positions, segment_ids) [B, S] once T new tokens are written at `index`."""
    put = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(
        buf, x.astype(jnp.int32), self.index, axis=1)
    return put(self.positions, positions_bt), put(self.segment_ids,
                                                  segment_ids_bt)


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
      index=jnp.zeros((), jnp.int32))


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
      raise ValueError(
          "pattern: Mamba-2 ('M') layers are reserved and not built yet; "
          'their parameters are counted by count_params, but a model with '
          "'M' layers cannot be instantiated")
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
               cache: KVCache | None = None,
               expert_idx: jax.Array | None = None,
               return_hidden: bool = False,
               moe_dispatch: str | None = None,
               moe_capacity: int | None = None,
               ) -> tuple[jax.Array, dict[str, Any]]:
    """Runs the model.

    Args:
      tokens_bt: [B, T] token ids.
      positions_bt: [B, T] positions (restart at 0 in each packed segment);
        default arange(T), or continuing the cache.
      segment_ids_bt: [B, T] packed-segment ids, 0 = padding; default 1.
      cache: a KVCache to attend over and write into (the sampler has its
        own forward over the cache: `cascade_jax.rollout`).
      expert_idx: [L_moe, B, T, k] experts to use in each MoE layer instead of
        the router's choice (replaying a rollout's routing).
      return_hidden: also return the final normed hidden states.
      moe_dispatch: overrides the MoE layers' configured dispatch path.
      moe_capacity: slots per expert for the `capacity` / `dropless` paths
        (e.g. `replay_capacity` of a replayed routing: then nothing drops).

    Returns:
      (logits [B, T, V] fp32, info) where info has 'aux_loss' (scalar sum of
      router aux losses), 'router' (per MoE layer stats stacked on axis 0:
      load [L, E], dropped [L], seq_aux [L], z_loss [L]), 'expert_idx'
      [L_moe, B, T, k], 'cache' (updated, if one was given), 'hidden'.
    """
    cfg = self.cfg
    b, t = tokens_bt.shape
    if segment_ids_bt is None:
      segment_ids_bt = jnp.ones((b, t), jnp.int32)
    if positions_bt is None:
      start = 0 if cache is None else cache.index
      positions_bt = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32),
                                      (b, t))
    x = self.embed(tokens_bt)
    if cache is not None:
      cache_pos, cache_seg = cache.written(positions_bt, segment_ids_bt)
    new_k, new_v, routers = [], [], []
    valid = segment_ids_bt != 0
    # Shared by every attention layer: computed once, not once per layer.
    rope_cs = (rope_tables(positions_bt, cfg.head_dim, cfg.rope_theta)
               if cfg.use_rope else None)
    if cache is None:
      mask = attention_mask(positions_bt, segment_ids_bt, positions_bt,
                            segment_ids_bt)
    else:
      mask = attention_mask(positions_bt, segment_ids_bt, cache_pos, cache_seg)
    for blk in self.blocks:
      h = blk.norm(x)
      if blk.kind == ATTENTION:
        a = len(new_k)
        kw = {}
        if cache is not None:
          kw = dict(kv_cache=(cache.k[a], cache.v[a]), cache_index=cache.index,
                    cache_positions_bs=cache_pos, cache_segment_ids_bs=cache_seg)
        h, (kk, vv) = blk.mixer(h, positions_bt=positions_bt,
                                segment_ids_bt=segment_ids_bt, rope_cs=rope_cs,
                                mask_bts=mask, **kw)
        new_k.append(kk)
        new_v.append(vv)
      elif blk.kind == MOE:
        replay = None if expert_idx is None else expert_idx[len(routers)]
        h, stats = blk.mixer(h, valid_bt=valid, expert_idx_btk=replay,
                             dispatch=moe_dispatch, capacity=moe_capacity)
        routers.append(stats)
      else:
        h = blk.mixer(h.reshape(b * t, -1)).reshape(b, t, -1)
      x = self.constrain(x + h)

    x = self.final_norm(x)
    logits = self._head(x)
    info: dict[str, Any] = {'aux_loss': jnp.zeros((), jnp.float32)}
    if routers:
      stacked = {k: jnp.stack([r[k] for r in routers]) for k in routers[0]}
      info['expert_idx'] = stacked.pop('expert_idx')
      info['aux_loss'] = stacked.pop('aux_loss').sum()
      info['router'] = stacked
    if cache is not None:
      info['cache'] = KVCache(k=tuple(new_k), v=tuple(new_v),
                              positions=cache_pos, segment_ids=cache_seg,
                              index=cache.index + t)
    if return_hidden:
      info['hidden'] = x
    return logits, info

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    """Token embeddings [B, T, D] in the compute dtype."""
    table = self.embed_vd[...]
    if self.ctx is not None:
      # FSDP-style: gather the table before the lookup, so that the lookup's
      # output can follow the batch sharding (a sharded-table gather cannot).
      table = self.ctx.constrain(table, (None, None))
    x = jnp.take(table, tokens_bt, axis=0).astype(jnp.dtype(self.cfg.dtype))
    return self.constrain(x)

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


def dropped_fraction(info) -> jax.Array:
  """The mean over MoE layers of a forward's dropped (token, choice) fraction.

  `info` is `Transformer.__call__`'s; 0 for a model without MoE layers.
  """
  if 'router' not in info:
    return jnp.zeros((), jnp.float32)
  return jnp.mean(info['router']['dropped'])


__all__ = ['ExpertBias', 'KVCache', 'Transformer', 'dropped_fraction',
           'init_cache']
