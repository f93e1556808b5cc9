"""Continuous batching: a fixed set of rows decode together, and a row whose sequence ends takes the next waiting prompt.

`generate` decodes a batch until its longest row ends: a finished row keeps
its slot (and its share of every step) until then. `generate_continuous`
keeps `slots` rows busy instead. Each row has its own write index in the KV
cache (`KVCache.index` [B]); when rows free up, the next prompts are
prefilled together (a batch of the freed rows, padded to a power of two)
and written into those rows, replacing the finished sequences (their
results are moved to the output first). So a step's cost follows the live
rows, not the longest one of a fixed batch.

A row's tokens are those `generate` draws for the same prompt, budget and
per-row key (`row_keys`): its cache holds the prompt at the same slots (every
prompt is left-padded to the longest one's bucket) and its draw at step t is
`fold_in(key, t)`, whatever slot it runs in and whoever runs beside it.

The loop between refills runs on the device (`lax.while_loop`); it returns
to the host when enough rows are free for the waiting prompts (`refill`
rows, or all of them near the end), so the host sees the batch a few times a
generation, not every step.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import sharding
from cascade_jax.rollout import _decode
from cascade_jax.rollout import _sampler

_TRACES = [0]


def trace_count() -> int:
  """How many times the continuous sampler's steps were traced here."""
  return _TRACES[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Rows:
  """What each of the B rows holds: its sequence so far and its cache."""
  cache: model_lib.KVCache     # index [B]: each row's next slot
  req: jax.Array               # [B] int32: the prompt the row holds, -1: none
  keys: jax.Array              # [B] the row's sampling key
  lens: jax.Array              # [B] its prompt's length
  t: jax.Array                 # [B] tokens sampled so far
  tok: jax.Array               # [B] the last token sampled (fed next)
  toks: jax.Array              # [B, N]
  lps: jax.Array               # [B, N]
  kept: jax.Array              # [B, N]
  experts: jax.Array           # [B, P + N, L_moe, k] (L_moe * k may be 0)
  done: jax.Array              # [B] bool: ended (or empty)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Out:
  """Every prompt's finished sequence, by prompt ([R, ...])."""
  toks: jax.Array
  lps: jax.Array
  kept: jax.Array
  experts: jax.Array


def _moe_shape(cfg: model_lib.ModelConfig, record: bool) -> tuple[int, int]:
  n_moe = cfg.pattern.count('E')
  return (n_moe, cfg.moe.top_k) if record and n_moe else (0, 0)


@functools.partial(jax.jit, static_argnums=(0, 2))
def decode_layouts(graph, state, b):
  return _decode.model_decode_weights(nnx.merge(graph, state), b)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 7, 8))
def _empty_rows(ctx, cfg, b, p, n, slots, key, record, pad_id) -> _Rows:
  cache = model_lib.init_cache(cfg, b, slots)
  cache = dataclasses.replace(cache, index=jnp.zeros((b,), jnp.int32))
  return sharding.constrain_rows(ctx, _Rows(cache=cache, req=jnp.full((b,), -1, jnp.int32),
               keys=jax.random.split(key, b), lens=jnp.ones((b,), jnp.int32),
               t=jnp.zeros((b,), jnp.int32),
               tok=jnp.full((b,), pad_id, jnp.int32),
               toks=jnp.full((b, n), pad_id, jnp.int32),
               lps=jnp.zeros((b, n), jnp.float32),
               kept=jnp.zeros((b, n), jnp.int32),
               experts=jnp.zeros((b, p + n) + _moe_shape(cfg, record),
                                 jnp.int32),
               done=jnp.ones((b,), bool)))


def _new_rows(ctx, cfg, b, p, n, record, pad_id) -> _Rows:
  """B empty rows for prompts of width p and n new tokens, on a mesh (`ctx`)
  split over its batch axes: each device holds its rows' cache."""
  return _empty_rows(ctx, cfg, b, p, n, ops.cache_slots(p + n),
                     jax.random.key(0), record, pad_id)


def put_rows(cache: model_lib.KVCache, new: model_lib.KVCache, which_k,
             index_k) -> model_lib.KVCache:
  """`cache` [B rows] with `new`'s k rows written into rows `which_k` (B:
  padding, dropped), their write index `index_k` [k]."""
  put = lambda x, y: x.at[which_k].set(y.astype(x.dtype), mode='drop')
  return jax.tree.map(put, cache, dataclasses.replace(new, index=index_k))


def _flush(rows: _Rows, out: _Out, which_k) -> _Out:
  """`out` with the sequences of rows `which_k` (B: none) written by prompt."""
  r = out.toks.shape[0]
  req = rows.req.at[which_k].get(mode='fill', fill_value=-1)
  dest = jnp.where(req >= 0, req, r)          # r: dropped
  take = lambda x: x.at[which_k].get(mode='fill', fill_value=0)
  put = lambda o, x: o.at[dest].set(take(x), mode='drop')
  return _Out(toks=put(out.toks, rows.toks), lps=put(out.lps, rows.lps),
              kept=put(out.kept, rows.kept),
              experts=put(out.experts, rows.experts))


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'stop_ids',
                                             'pad_id', 'record_experts'),
                   donate_argnames=('rows', 'out'))
def _insert(graph, state, layouts, rows: _Rows, out: _Out, prompts_rp, lens_r,
            keys_r, take_k, which_k, req_k, *, cfg, stop_ids, pad_id,
            record_experts):
  """Prefills prompts `take_k` into rows `which_k` (B: padding), their first
  tokens sampled; the rows' previous sequences go to `out` first."""
  _TRACES[0] += 1
  model = nnx.merge(graph, state)
  out = _flush(rows, out, which_k)
  prompts_kp, lens_k, keys_k = prompts_rp[take_k], lens_r[take_k], keys_r[take_k]
  k, p = prompts_kp.shape
  n = cfg.max_new_tokens
  fresh = model_lib.init_cache(model.cfg, k, rows.cache.max_len)
  logits, fresh, prompt_experts = _sampler.prefill(model, prompts_kp, lens_k,
                                                   fresh, layouts)
  tok, lp, n_kept = _sampler.select_tokens(logits[:, -1],
                                     _sampler.row_keys(keys_k, 0), cfg)
  experts = jnp.zeros((k, p + n) + rows.experts.shape[2:], jnp.int32)
  if rows.experts.shape[-1]:
    experts = experts.at[:, :p].set(prompt_experts)
  put = lambda x, y: x.at[which_k].set(y.astype(x.dtype), mode='drop')
  cache = put_rows(rows.cache, fresh, which_k, jnp.full((k,), p))
  first = lambda x, fill, dt: jnp.full((k, n), fill, dt).at[:, 0].set(x)
  rows = _Rows(
      cache=cache, req=put(rows.req, req_k), keys=put(rows.keys, keys_k),
      lens=put(rows.lens, lens_k), t=put(rows.t, jnp.ones((k,), jnp.int32)),
      tok=put(rows.tok, tok),
      toks=put(rows.toks, first(tok, pad_id, jnp.int32)),
      lps=put(rows.lps, first(lp, 0.0, jnp.float32)),
      kept=put(rows.kept, first(n_kept, model.cfg.vocab_size, jnp.int32)),
      experts=put(rows.experts, experts),
      done=put(rows.done, _sampler.is_stop(tok, stop_ids) | (n <= 1)))
  return sharding.constrain_rows(model.ctx, rows), out


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'stop_ids'),
                   donate_argnames=('rows',))
def _decode_until(graph, state, layouts, rows: _Rows, wanted, *, cfg,
                  stop_ids):
  """Decodes every live row until `wanted` rows are done, or all of them.

  Returns (rows, the steps run).
  """
  _TRACES[0] += 1
  model = nnx.merge(graph, state)
  b, n = rows.toks.shape
  p = rows.experts.shape[1] - n
  record = rows.experts.shape[-1] > 0
  bi = jnp.arange(b)

  def cond(c):
    r, _ = c
    return (jnp.sum(r.done) < wanted) & ~jnp.all(r.done)

  def body(c):
    r, steps = c
    # Each live row feeds its token t - 1 at its own slot and position, then
    # samples token t; an ended row feeds padding in place (index kept).
    live = ~r.done
    pos = (r.lens + r.t - 1)[:, None]
    rope = (model_lib.rope_tables(pos, model.cfg.head_dim,
                                  model.cfg.rope_theta)
            if model.cfg.use_rope else None)
    logits, cache, step_experts = _decode.forward(
        model, r.tok[:, None], positions_bt=pos,
        segment_ids_bt=live[:, None].astype(jnp.int32), cache=r.cache,
        layouts=layouts, rope_cs=rope)
    cache = dataclasses.replace(cache, index=r.cache.index + live)
    experts = r.experts
    if record:
      at = jnp.where(live, p + r.t - 1, p + n)            # p + n: dropped
      experts = experts.at[bi, at].set(step_experts[:, 0], mode='drop')
    tok, lp, n_kept = _sampler.select_tokens(logits[:, -1],
                                       _sampler.row_keys(r.keys, r.t), cfg)
    at = jnp.where(live, r.t, n)                           # n: dropped
    t = r.t + live
    rows = _Rows(
        cache=cache, req=r.req, keys=r.keys, lens=r.lens, t=t,
        tok=jnp.where(live, tok, r.tok),
        toks=r.toks.at[bi, at].set(tok, mode='drop'),
        lps=r.lps.at[bi, at].set(lp, mode='drop'),
        kept=r.kept.at[bi, at].set(n_kept, mode='drop'),
        experts=experts,
        done=r.done | (live & (_sampler.is_stop(tok, stop_ids) | (t >= n))))
    # On a mesh each device keeps its rows' cache from step to step.
    return sharding.constrain_rows(model.ctx, rows), steps + 1

  return jax.lax.while_loop(cond, body, (rows, jnp.zeros((), jnp.int32)))


def insert_bucket(k: int, b: int, shards: int = 1) -> int:
  """The insert batch for k prompts: the next power of two, rounded up to a
  multiple of `shards` (the devices the batch is split over: fewer rows
  than that would prefill on every device), at most b."""
  return min(-(-(1 << max(k - 1, 0).bit_length()) // shards) * shards, b)


def generate_continuous(model: nnx.Module, prompts: Sequence[Sequence[int]],
                        *, cfg: _sampler.SampleConfig,
                        stop_ids: int | Sequence[int], slots: int,
                        pad_id: int = 0, keys: jax.Array | None = None,
                        refill: int | None = None,
                        record_experts: bool = False,
                        stats: dict | None = None,
                        prompt_width: int = 0,
                        prefill_rows: int = 0) -> _sampler.Rollout:
  """Samples one continuation per prompt, `slots` rows at a time, refilled as rows end.

  Args:
    model: a `Transformer`, on one device or sharded over a mesh (the
      rows then split over the 'batch' rule's axes, each device keeping its
      rows' cache; `slots` rounded up to a multiple of those devices, and
      each prefill at least one row a device).
    prompts: R token lists, any R (more than `slots` is the point).
    cfg, stop_ids, pad_id, record_experts: as `generate`.
    slots: rows decoded together.
    keys: [R] one key a prompt (`row_keys`); default `split(key(0), R)`.
    refill: how many rows must be free (while prompts wait) before the
      device loop stops to prefill the next ones; default slots // 8, at
      least 1. Fewer prefills of more rows, against rows left idle longer.
    stats: if a dict, gets `steps` (decode steps), `refills` (prefill
      calls), `max_prefill` (the most rows one of them took, padding
      included) and `row_steps` (live row-steps) of this call.
    prompt_width: prompts left-padded to at least this width (`pad_prompts`'
      `width`: a run's longest prompt, so that every call has one shape).
    prefill_rows: the most rows one prefill takes (rounded up to a multiple
      of the batch devices), the first fill of every slot included; 0: every
      free row at once. A prefill's activations grow with its rows x prompt
      width, the decode loop's with the rows' caches only: on a pod the
      first fill of every slot can need far more memory than the decode
      (docs/results/archive/plan_prefill_rows_2026-12-07). Chunks of fewer rows
      bound that peak at the price of more, smaller prefills; the samples
      are the same.

  Returns:
    A `Rollout` of R rows in the order of `prompts`, equal to `generate`'s
    with the same per-row keys.
  """
  if slots < 1:
    raise ValueError(f'generate_continuous: slots must be >= 1, got {slots}')
  if prefill_rows < 0:
    raise ValueError('generate_continuous: prefill_rows must be >= 0 (0: '
                     f'every free row at once), got {prefill_rows}')
  ctx = getattr(model, 'ctx', None)
  shards = 1 if ctx is None else ctx.shards('batch')
  slots = -(-slots // shards) * shards
  r = len(prompts)
  tokens_rp, lengths_r = _sampler.pad_prompts(prompts, cfg.prompt_bucket,
                                              pad_id, width=prompt_width)
  p = tokens_rp.shape[1]
  tokens_rp, lengths_r = jax.device_put((tokens_rp, lengths_r))
  keys = jax.random.split(jax.random.key(0), r) if keys is None else keys
  if keys.shape != (r,):
    raise ValueError(f'generate_continuous: {keys.shape} keys for {r} '
                     'prompts (give one key a prompt)')
  refill = max(1, slots // 8) if refill is None else max(1, int(refill))
  stop_ids = _sampler.stop_tuple(stop_ids)
  graph, state = nnx.split(model)
  b, n = slots, cfg.max_new_tokens
  mcfg = model.cfg
  layouts = decode_layouts(graph, state, b)
  # The rows one prefill takes: a multiple of the batch devices, at most b.
  cap = min(b, -(-prefill_rows // shards) * shards) if prefill_rows else b
  rows = _new_rows(ctx, mcfg, b, p, n, record_experts, pad_id)
  moe = _moe_shape(mcfg, record_experts)
  out = _Out(toks=jnp.full((r, n), pad_id, jnp.int32),
             lps=jnp.zeros((r, n), jnp.float32),
             kept=jnp.full((r, n), mcfg.vocab_size, jnp.int32),
             experts=jnp.zeros((r, p + n) + moe, jnp.int32))
  static = dict(cfg=cfg, stop_ids=stop_ids)
  waiting = collections.deque(range(r))
  done = np.ones((b,), bool)
  refills, max_prefill, steps = 0, 0, []
  while True:
    while waiting and done.any():     # `cap` rows a prefill
      free = np.flatnonzero(done)[:min(len(waiting), cap)]
      k = insert_bucket(len(free), cap, shards)
      idx = np.asarray([waiting.popleft() for _ in free])
      pad = k - len(free)
      which = np.concatenate([free, np.full((pad,), b)]).astype(np.int32)
      take = np.concatenate([idx, np.repeat(idx[-1:], pad)])
      req = np.concatenate([idx, np.full((pad,), -1)]).astype(np.int32)
      rows, out = _insert(graph, state, layouts, rows, out, tokens_rp,
                          lengths_r, keys, jnp.asarray(take, jnp.int32),
                          jnp.asarray(which), jnp.asarray(req), pad_id=pad_id, record_experts=record_experts,
                          **static)
      done[free] = False   # this host's view until the decode loop returns
      refills, max_prefill = refills + 1, max(max_prefill, k)
    wanted = min(len(waiting), refill) if waiting else b + 1
    rows, ran = _decode_until(graph, state, layouts, rows,
                              jnp.asarray(wanted, jnp.int32), **static)
    steps.append(ran)
    done = np.array(sharding.to_host(rows.done))   # every process; writable
    if not waiting and done.all():
      break
  result = _finish(rows, out, stop_ids=stop_ids, record=bool(moe[0]))
  if stats is not None:
    stats.update(steps=int(sum(sharding.to_host(steps))), refills=refills,
                 max_prefill=max_prefill,
                 row_steps=int(sharding.to_host(jnp.sum(result.mask))))
  return result


@functools.partial(jax.jit, static_argnames=('stop_ids', 'record'),
                   donate_argnames=('out',))
def _finish(rows: _Rows, out: _Out, *, stop_ids, record) -> _sampler.Rollout:
  """Every prompt's `Rollout`, once the last sequences are flushed."""
  out = _flush(rows, out, jnp.arange(rows.toks.shape[0]))
  mask, has_stop = _sampler.reply_mask(out.toks, stop_ids, out.toks.shape[1])
  return _sampler.Rollout(
      tokens=out.toks, logprobs=out.lps * mask, mask=mask,
      truncated=~has_stop, kept=out.kept,
      expert_idx=out.experts if record else None)


__all__ = ['generate_continuous']
