"""Continuous batching of episodes: each row plays its own episode on its own turn.

`run_episodes` with a fixed batch plays turn j of every episode together:
a turn lasts until its longest reply ends, and the batch until its longest
episode ends, so rows that finished (a short reply, a one-turn episode)
decode padding meanwhile. Here `slots` rows decode together, each at its
own point: when a row's reply ends, the host steps its environment and
either feeds the observation into that row (its next turn starts) or, the
episode over, prefills the next waiting episode into it. A step's cost
follows the rows that are sampling.

Each row has its own write index in the KV cache (`KVCache.index` [B]): its
prompt (left-padded to the run's width), its replies and its observation
blocks (left-padded to `APPEND_BUCKET` columns, fed a chunk at a time)
follow each other in its own slots. A new episode's prompt is prefilled
for the rows that need one only (a batch of their own, a power of two, at
most `prefill_rows`), then written into them; observations are fed in
place, every row through the model and the others' columns padding, so no
row's cache is ever copied. A row that is not sampling
feeds padding in place during the others' decode steps (segment 0, never
attended; its index stays), so the cache keeps one chunk of headroom.
Positions count a row's own tokens, as in `Conversation`; Mamba layers step
over the padding (`carry_mamba`), so every row's keys, values and states
are its episode's laid out contiguously: what the fixed batch computes, and
what the learner scores.

An episode's turn j draws token t with `row_keys(turn_keys(keys, j), t)`, its
key alone, whatever row it runs in and whoever runs beside it: its tokens
are those of `run_episodes` with the same `keys` and no slots (tested), its
log-probs equal within float error (other batch shapes).
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import sharding
from cascade_jax.rollout import _continuous
from cascade_jax.rollout import _decode
from cascade_jax.rollout import _episode
from cascade_jax.rollout import _sampler
from cascade_jax.rollout import _turns


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Rows:
  """Each of the B rows' episode state on the device."""
  cache: model_lib.KVCache     # index [B]: the row's next slot
  logits: jax.Array            # [B, V] fp32: its next-token logits
  pos: jax.Array               # [B] the position of the next token it feeds
  keys: jax.Array              # [B] its current turn's key
  t: jax.Array                 # [B] tokens sampled this turn
  tok: jax.Array               # [B] the last token sampled (fed next)
  live: jax.Array              # [B] bool: sampling its turn
  toks: jax.Array              # [B, N] this turn's tokens
  lps: jax.Array               # [B, N]
  kept: jax.Array              # [B, N]
  experts: jax.Array           # [B, N, L_moe, k]: token t's experts (fed ones)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 6))
def _empty(ctx, mcfg, b, slots, n, moe, pad_id) -> _Rows:
  cache = model_lib.init_cache(mcfg, b, slots)
  cache = dataclasses.replace(cache, index=jnp.zeros((b,), jnp.int32))
  zeros = lambda dt: jnp.zeros((b,), dt)
  return sharding.constrain_rows(ctx, _Rows(
      cache=cache, logits=jnp.zeros((b, mcfg.vocab_size), jnp.float32),
      pos=zeros(jnp.int32), keys=jax.random.split(jax.random.key(0), b),
      t=zeros(jnp.int32), tok=jnp.full((b,), pad_id, jnp.int32),
      live=zeros(bool), toks=jnp.full((b, n), pad_id, jnp.int32),
      lps=jnp.zeros((b, n), jnp.float32),
      kept=jnp.full((b, n), mcfg.vocab_size, jnp.int32),
      experts=jnp.zeros((b, n) + moe, jnp.int32)))


def _begin(rows: _Rows, start, keys, pos=None) -> _Rows:
  """Rows `start` [B] bool begin a turn with `keys` [B] (and `pos`)."""
  return dataclasses.replace(
      rows, live=rows.live | start, t=jnp.where(start, 0, rows.t),
      keys=jnp.where(start, keys, rows.keys),
      pos=rows.pos if pos is None else jnp.where(start, pos, rows.pos))


def _put(x, which_k, y):
  """`x` with `y` in rows `which_k` (B: padding, dropped)."""
  return x.at[which_k].set(y.astype(x.dtype), mode='drop')


def _start_turns(rows: _Rows, which_k, pos_k, keys_k, ctx) -> _Rows:
  """Rows `which_k` (B: padding, dropped) begin a turn at position `pos_k`
  with `keys_k`; on a mesh (`ctx`) the rows stay split over it."""
  start = _put(jnp.zeros(rows.t.shape, bool), which_k,
               jnp.ones(which_k.shape, bool))
  return sharding.constrain_rows(ctx, _begin(
      rows, start, _put(rows.keys, which_k, keys_k),
      _put(rows.pos, which_k, pos_k)))


@functools.partial(jax.jit, static_argnames=('ctx',), donate_argnames=('rows',))
def _place(rows: _Rows, cache, logits, which_k, index_k, pos_k, keys_k, *,
           ctx) -> _Rows:
  """Writes k rows' `cache` and `logits` into rows `which_k` (B: padding,
  dropped) at write index `index_k` and position `pos_k`; their turn
  begins with `keys_k`."""
  rows = dataclasses.replace(
      rows, cache=_continuous.put_rows(rows.cache, cache, which_k, index_k),
      logits=_put(rows.logits, which_k, logits))
  return _start_turns(rows, which_k, pos_k, keys_k, ctx)


@functools.partial(jax.jit, static_argnames=('ctx',), donate_argnames=('rows',))
def _fed(rows: _Rows, index_b, which_b, pos_b, keys_b, *, ctx) -> _Rows:
  """After an in-place feed: every row's write index `index_b` [B] (the
  others' as before the feed); rows `which_b` (B: padding, dropped) begin
  their turn at position `pos_b` with `keys_b`."""
  rows = dataclasses.replace(
      rows, cache=dataclasses.replace(rows.cache, index=index_b))
  return _start_turns(rows, which_b, pos_b, keys_b, ctx)


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'stop_ids'),
                   donate_argnames=('rows',))
def _decode_turns(graph, state, layouts, rows: _Rows, wanted, *, cfg,
                  stop_ids):
  """Every live row samples its turn until `wanted` rows are not live, or none is.

  A row at token 0 of its turn samples from its logits (its prompt's or
  observation's); after that it feeds token t - 1 at its own slot and
  position, then samples token t. A row that is not live feeds padding in
  place. Returns (rows, the steps run).
  """
  model = nnx.merge(graph, state)
  b, n = rows.toks.shape
  bi = jnp.arange(b)
  record = rows.experts.shape[-1] > 0
  mamba = model_lib.MAMBA in model.cfg.pattern

  def cond(c):
    r, _ = c
    return (jnp.sum(~r.live) < wanted) & jnp.any(r.live)

  def body(c):
    r, steps = c
    feed = r.live & (r.t > 0)
    step_logits, cache, step_experts = _decode.forward(
        model, r.tok[:, None], positions_bt=r.pos[:, None],
        segment_ids_bt=feed[:, None].astype(jnp.int32), cache=r.cache,
        layouts=layouts, carry_mamba=mamba)
    cache = dataclasses.replace(cache, index=r.cache.index + feed)
    experts = r.experts
    if record:
      at = jnp.where(feed, r.t - 1, n)                     # n: dropped
      experts = experts.at[bi, at].set(step_experts[:, 0], mode='drop')
    logits = jnp.where(feed[:, None], step_logits[:, -1].astype(jnp.float32),
                       r.logits)
    tok, lp, n_kept = _sampler.select_tokens(logits, _sampler.row_keys(r.keys, r.t),
                                       cfg)
    at = jnp.where(r.live, r.t, n)                         # n: dropped
    t = r.t + r.live
    # On a mesh each device keeps its rows' cache from step to step.
    return sharding.constrain_rows(model.ctx, dataclasses.replace(
        r, cache=cache, logits=logits, pos=r.pos + feed, t=t,
        tok=jnp.where(r.live, tok, r.tok),
        toks=r.toks.at[bi, at].set(tok, mode='drop'),
        lps=r.lps.at[bi, at].set(lp, mode='drop'),
        kept=r.kept.at[bi, at].set(n_kept, mode='drop'),
        experts=experts,
        live=r.live & ~(_sampler.is_stop(tok, stop_ids) | (t >= n)))
    ), steps + 1

  return jax.lax.while_loop(cond, body, (rows, jnp.zeros((), jnp.int32)))


class _Engine:
  """The rows on the device and the host calls that change them."""

  def __init__(self, model, *, b, width, slots, sample, stop_ids, pad_id,
               record_experts, cap):
    self.model, self.b, self.width, self.pad_id = model, b, width, pad_id
    self.ctx = getattr(model, 'ctx', None)
    self.shards = 1 if self.ctx is None else self.ctx.shards('batch')
    self.cap = cap            # the most rows one prefill takes
    self.max_rows = 0         # the most one took (padding included)
    self.graph, self.state = nnx.split(model)
    self.static = dict(cfg=sample, stop_ids=_sampler.stop_tuple(stop_ids))
    self.slots = slots
    mcfg = model.cfg
    n_moe = mcfg.pattern.count(model_lib.MOE)
    moe = (n_moe, mcfg.moe.top_k) if record_experts and n_moe else (0, 0)
    self.record = bool(moe[0])
    self.layouts = _continuous.decode_layouts(self.graph, self.state, b)
    self.rows = _empty(self.ctx, mcfg, b, slots, sample.max_new_tokens, moe,
                       pad_id)

  def _block(self, blocks: list, w: int, starts: list[int]):
    """Left-padded [k, w] tokens, validity and positions (k: the bucket of
    len(blocks); padding rows empty)."""
    k = _continuous.insert_bucket(len(blocks), self.cap, self.shards)
    self.max_rows = max(self.max_rows, k)
    toks = np.full((k, w), self.pad_id, np.int32)
    valid = np.zeros((k, w), bool)
    pos = np.zeros((k, w), np.int32)
    for j, (t, p0) in enumerate(zip(blocks, starts)):
      toks[j, w - len(t):], valid[j, w - len(t):] = t, True
      pos[j, w - len(t):] = p0 + np.arange(len(t))
    return toks, valid, pos

  def _rows(self, which: np.ndarray, k: int):
    """(rows to gather, rows to write: padding goes to B and is dropped)."""
    pad = k - len(which)
    return (np.concatenate([which, np.repeat(which[:1], pad)]).astype(np.int32),
            np.concatenate([which, np.full((pad,), self.b)]).astype(np.int32))

  def _keys(self, keys: jax.Array, k: int) -> jax.Array:
    return jnp.concatenate([keys, jnp.repeat(keys[:1], k - len(keys), 0)])

  def place(self, which: np.ndarray, prompts: list, keys: jax.Array):
    """Prefills `prompts` (left-padded to the run's width, as
    `Conversation`'s first block) into rows `which`, fresh; their first
    turn begins with `keys`. Returns the block's experts [k, W, L, k] (or
    None)."""
    w = self.width
    toks, valid, pos = self._block(prompts, w, [0] * len(prompts))
    k = toks.shape[0]
    cache = model_lib.init_cache(self.model.cfg, k, self.slots)
    logits, cache, experts = _turns.feed_block(
        self.graph, self.state, jnp.asarray(toks), jnp.asarray(valid),
        jnp.asarray(pos), cache,
        jnp.zeros((k, self.model.cfg.vocab_size), jnp.float32))
    _, put = self._rows(which, k)
    self.rows = _place(self.rows, cache, logits, jnp.asarray(put),
                       jnp.full((k,), w, jnp.int32),
                       jnp.asarray(valid.sum(1), jnp.int32),
                       self._keys(keys, k), ctx=self.ctx)
    return sharding.to_host(experts) if self.record else None

  def feed(self, which: np.ndarray, blocks: list, keys: jax.Array):
    """Feeds rows `which` their tokens (left-padded to whole chunks of
    `APPEND_BUCKET`, as `Conversation.append`) in place: every row goes
    through the model, the others' columns padding (segment 0, never
    attended, written into the one chunk of headroom past their write
    index, which stays). No row's cache is copied (a gather of the fed
    rows' caches cost a row's whole cache each, ~1 GB a row a chip in the
    30B plan, and moved rows between devices on a mesh), and every feed has
    one shape. Their next turn begins with `keys`. Returns the block's
    experts [k, W, L, k] (row j: which[j]) or None."""
    bucket = _turns.APPEND_BUCKET
    w = -(-max(map(len, blocks)) // bucket) * bucket
    here, index = sharding.to_host((self.rows.pos, self.rows.cache.index))
    toks = np.full((self.b, w), self.pad_id, np.int32)
    valid = np.zeros((self.b, w), bool)
    pos = np.zeros((self.b, w), np.int32)
    for row, t in zip(which, blocks):
      toks[row, w - len(t):], valid[row, w - len(t):] = t, True
      pos[row, w - len(t):] = here[row] + np.arange(len(t))
    feed = _turns.feed_fn(self.model.cfg)
    cache, logits, out = self.rows.cache, self.rows.logits, []
    for c in range(0, w, bucket):   # the cache is donated: in place
      logits, cache, experts = feed(
          self.graph, self.state, jnp.asarray(toks[:, c:c + bucket]),
          jnp.asarray(valid[:, c:c + bucket]),
          jnp.asarray(pos[:, c:c + bucket]), cache, logits)
      out.append(experts)
    fed = np.zeros((self.b,), bool)
    fed[which] = True
    _, put = self._rows(which, self.b)
    self.rows = _fed(
        dataclasses.replace(self.rows, cache=cache, logits=logits),
        jnp.asarray(np.where(fed, index + w, index), jnp.int32),
        jnp.asarray(put), jnp.asarray(np.concatenate([
            here[which] + valid[which].sum(1),
            np.zeros((self.b - len(which),))]), jnp.int32),
        self._keys(keys, self.b), ctx=self.ctx)
    if not self.record:
      return None
    return np.concatenate(sharding.to_host(out), 1)[which]

  def decode(self, wanted: int) -> int:
    self.rows, ran = _decode_turns(self.graph, self.state, self.layouts,
                                   self.rows, jnp.asarray(wanted, jnp.int32),
                                   **self.static)
    return int(sharding.to_host(ran))


def _chunks(rows: np.ndarray, cap: int) -> list[np.ndarray]:
  """`rows` in order, at most `cap` a chunk."""
  return [rows[i:i + cap] for i in range(0, len(rows), cap)]


def play(model, tok, eps, envs, keys: jax.Array, *, cfg, sample, slots: int,
         refill, pool, record_experts: bool, timing: dict, prompt_width: int,
         stats: dict | None, prefill_rows: int = 0) -> None:
  """Plays `eps` (started by `run_episodes`) `slots` rows at a time,
  prefilling new episodes `prefill_rows` rows at a time at most (0: every
  free row at once); observations go in in place, every row at once."""
  if slots < 1:
    raise ValueError(f'run_episodes: slots must be >= 1, got {slots}')
  if prefill_rows < 0:
    raise ValueError('run_episodes: prefill_rows must be >= 0 (0: every '
                     f'free row at once), got {prefill_rows}')
  r = len(eps)
  # On a mesh, a multiple of the devices the rows are split over.
  ctx = getattr(model, 'ctx', None)
  shards = 1 if ctx is None else ctx.shards('batch')
  b = -(-min(slots, r) // shards) * shards
  cap = min(b, -(-prefill_rows // shards) * shards) if prefill_rows else b
  width = max(max(len(e.tokens) for e in eps), prompt_width)
  refill = max(1, b // 8) if refill is None else max(1, int(refill))
  engine = _Engine(model, b=b, width=width, sample=sample,
                   slots=ops.cache_slots(cfg.slots(width) +
                                         _turns.APPEND_BUCKET),
                   stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                   record_experts=record_experts, cap=cap)
  stop_ids = _sampler.stop_tuple(tok.stop_ids)
  waiting = collections.deque(range(r))
  episode = np.full((b,), -1)              # the episode each row plays
  steps = row_steps = places = 0
  while True:
    for free in _chunks(np.flatnonzero(episode < 0)[:len(waiting)], cap):
      idx = [waiting.popleft() for _ in free]
      episode[free] = idx
      exps = engine.place(free, [eps[i].tokens for i in idx],
                          _episode.turn_keys(keys[np.asarray(idx)], 0))
      places += 1
      if exps is not None:
        for j, i in enumerate(idx):
          eps[i].experts = list(exps[j, width - len(eps[i].tokens):])
    if not (episode >= 0).any():
      break
    # Back to the host once `refill` more rows have ended their turn (their
    # environments step, their observations or next episodes go in), or
    # no row is sampling.
    wanted = min(b, int((episode < 0).sum()) + refill)
    steps += engine.decode(wanted)
    rows = engine.rows
    # Host reads through to_host: on a pod every process reads every row.
    live, t, toks = sharding.to_host((rows.live, rows.t, rows.toks))
    ended = np.flatnonzero(~live & (episode >= 0))
    if not len(ended):
      continue
    lps, kept = sharding.to_host((rows.lps, rows.kept))
    experts = sharding.to_host(rows.experts) if engine.record else None
    texts, stopped = {}, {}
    for row in ended:
      stops = np.isin(toks[row], stop_ids)
      stopped[row] = bool(stops[:t[row]].any())
      length = int(np.argmax(stops)) + 1 if stopped[row] else int(t[row])
      row_steps += length
      texts[row] = _episode.take_reply(
          eps[episode[row]], tok, toks[row], lps[row], kept[row],
          None if experts is None else experts[row], length)
    answers = _episode.step_envs(
        pool, {row: envs[episode[row]] for row in ended},
        {row: texts[row] for row in ended if stopped[row]}, timing)
    blocks = {}
    for row in ended:
      e = eps[episode[row]]
      fed = _episode.after_step(e, tok, cfg, stopped[row], answers.get(row))
      if fed is None:
        episode[row] = -1
      else:
        blocks[row] = fed
    if blocks:    # fed in place: no row's cache is copied, any count
      which = np.asarray(list(blocks))
      turns = jnp.asarray([eps[episode[row]].turns for row in which])
      exps = engine.feed(which, list(blocks.values()), _episode.turn_keys(
          keys[np.asarray(episode[which])], turns))
      if exps is not None:
        for j, (row, fed) in enumerate(blocks.items()):
          _episode.take_block(eps[episode[row]],
                                exps[j, exps.shape[1] - len(fed):])
  if stats is not None:
    stats.update(steps=steps, row_steps=row_steps, places=places,
                 slots=b, tokens_per_step=row_steps / max(steps, 1),
                 max_prefill=engine.max_rows)


__all__ = ['play']
