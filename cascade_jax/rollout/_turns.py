"""Multi-turn generation: one KV cache per episode across its turns.

A `Conversation` holds a batch of episodes on the sampler's side. Its KV
cache is written at one slot index shared by every row (as in `generate`):

  [prompt, left-padded] [reply 1 ...] [obs 1, left-padded] [reply 2 ...] ...

A row that stops early leaves empty slots (segment 0, never attended) for
the rest of its turn, and an appended block is left-padded the same way, so
rows of different reply and observation lengths share one cache and one
compiled step. Positions count a row's own tokens only: a row's keys, values
and positions are exactly those of its episode laid out contiguously, which
is the sequence the learner scores (`rl.from_episodes`).

The last token a turn samples (its <|im_end|>, or the last token of a cut
reply) is not fed in that turn: the next `append` feeds it with the
environment's observation, so the observation is appended, never re-encoded.

Mamba layers carry a state instead of reading the cache's slots, so they
must step over the empty slots rather than mask them: the first block (the
prompts, left-padded, each row one run from a fresh state) is one chunked
forward as in `generate`; after it every token goes through the one-token
step with `carry_mamba` (a row fed padding keeps its states, a fed row
continues them), appended blocks token by token in a `scan`. A row's states
are then those of its episode laid out contiguously, as the learner's
forward computes them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import sharding
from cascade_jax.rollout import _decode
from cascade_jax.rollout import _sampler
from cascade_jax.rollout._sampler import SampleConfig

APPEND_BUCKET = 16


@dataclasses.dataclass
class Turn:
  """One turn of every row (host arrays); rows that were not active are all zero / pad."""
  tokens: np.ndarray       # [B, N] int32
  logprobs: np.ndarray     # [B, N] float32, 0 off the mask
  mask: np.ndarray         # [B, N] int32: the reply's tokens (stop included)
  kept: np.ndarray         # [B, N] int32: the sampler's kept-set sizes
  stopped: np.ndarray      # [B] bool: ended with one of the stop ids
  experts: np.ndarray | None   # [B, N, L_moe, k]: token t's experts (fed ones)

  @property
  def lengths(self) -> np.ndarray:
    return self.mask.sum(1)


@functools.partial(jax.jit, static_argnames=('graph',),
                   donate_argnames=('cache',))
def feed_block(graph, state, tokens_bw, valid_bw, pos_bw, cache, prev_logits):
  """Writes a left-padded block into the cache; the next-token logits of each row."""
  model = nnx.merge(graph, state)
  b = tokens_bw.shape[0]
  layouts = _decode.model_decode_weights(model, b)
  logits, cache, experts = _decode.forward(
      model, tokens_bw, positions_bt=pos_bw,
      segment_ids_bt=valid_bw.astype(jnp.int32), cache=cache, layouts=layouts,
      last_logits_only=True)
  fed = jnp.any(valid_bw, axis=1)
  logits = jnp.where(fed[:, None], logits[:, -1].astype(jnp.float32),
                     prev_logits)
  return logits, cache, experts


@functools.partial(jax.jit, static_argnames=('graph',),
                   donate_argnames=('cache',))
def _feed_steps(graph, state, tokens_bw, valid_bw, pos_bw, cache, prev_logits):
  """`feed_block` one column at a time (models with Mamba layers: their states
  skip each row's padding instead of restarting after it)."""
  model = nnx.merge(graph, state)
  b = tokens_bw.shape[0]
  layouts = _decode.model_decode_weights(model, b)

  def step(carry, col):
    cache, logits = carry
    tok_b, valid_b, pos_b = col
    step_logits, cache, experts = _decode.forward(
        model, tok_b[:, None], positions_bt=pos_b[:, None],
        segment_ids_bt=valid_b.astype(jnp.int32)[:, None], cache=cache,
        layouts=layouts, carry_mamba=True)
    logits = jnp.where(valid_b[:, None], step_logits[:, -1].astype(
        jnp.float32), logits)
    return (cache, logits), (jnp.zeros((0,), jnp.int32) if experts is None
                             else experts[:, 0])

  (cache, logits), experts = jax.lax.scan(
      step, (cache, prev_logits), (tokens_bw.T, valid_bw.T, pos_bw.T))
  # experts: [W, B, L_moe, k] -> [B, W, L_moe, k]
  experts = None if experts.ndim < 4 else jnp.swapaxes(experts, 0, 1)
  return logits, cache, experts


def feed_fn(cfg: model_lib.ModelConfig):
  """The jitted block feed for `cfg`'s model: `feed_block`, or `_feed_steps`
  where the pattern has Mamba layers. Episode slots feed observations with
  it (every row, in place), and the AOT plan compiles it (its `feed` step)."""
  return _feed_steps if model_lib.MAMBA in cfg.pattern else feed_block


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'stop_ids',
                                             'pad_id', 'record_experts'),
                   donate_argnames=('cache',))
def _turn(graph, state, logits0, cache, next_pos_b, active_b, key, *, cfg,
          stop_ids, pad_id, record_experts):
  """One reply per active row: sample, feed, until every row stops or `N` tokens.

  Token t - 1 is fed at step t if its row has not ended with it (segment 1),
  else the slot stays empty (segment 0). Returns the turn's arrays, the
  cache, the next-token logits and how many slots were written.
  """
  model = nnx.merge(graph, state)
  b = logits0.shape[0]
  n = cfg.max_new_tokens
  layouts = _decode.model_decode_weights(model, b)
  n_moe = model.cfg.pattern.count(model_lib.MOE)
  k_top = model.cfg.moe.top_k if n_moe else 0

  choose = functools.partial(_sampler.choose_step, cfg=cfg, pad_id=pad_id,
                             stop_ids=stop_ids)

  def cond(c):
    t, *_, done = c
    return (t < n) & ~jnp.all(done)

  def body(c):
    t, tok, cache, logits, key, toks, lps, kept, experts, done = c
    feed = ~done
    step_logits, cache, step_experts = _decode.forward(
        model, tok[:, None], positions_bt=(next_pos_b + t - 1)[:, None],
        segment_ids_bt=feed.astype(jnp.int32)[:, None], cache=cache,
        layouts=layouts, carry_mamba=model_lib.MAMBA in model.cfg.pattern)
    if record_experts and n_moe:
      experts = experts.at[:, t - 1].set(
          jnp.where(feed[:, None, None], step_experts[:, 0], 0))
    logits = jnp.where(feed[:, None], step_logits[:, -1].astype(jnp.float32),
                       logits)
    tok, key, toks, lps, kept, done = choose(t, logits, key, toks, lps, kept,
                                             done)
    return (t + 1, tok, cache, logits, key, toks, lps, kept, experts, done)

  done0 = ~active_b
  tok, key, toks, lps, kept, done = choose(
      0, logits0, key, jnp.full((b, n), pad_id, jnp.int32),
      jnp.zeros((b, n), jnp.float32),
      jnp.full((b, n), model.cfg.vocab_size, jnp.int32), done0)
  init = (jnp.ones((), jnp.int32), tok, cache, logits0, key, toks, lps, kept,
          jnp.zeros((b, n, n_moe, k_top), jnp.int32), done)
  t, _, cache, logits, _, toks, lps, kept, experts, _ = jax.lax.while_loop(
      cond, body, init)
  stops = _sampler.is_stop(toks, stop_ids)
  has_stop = jnp.any(stops, axis=1) & active_b
  length = jnp.where(has_stop, jnp.argmax(stops, axis=1) + 1, t)
  mask = ((jnp.arange(n)[None, :] < length[:, None]) & active_b[:, None]
          ).astype(jnp.int32)
  return (toks, lps * mask, mask, kept, has_stop, experts), cache, logits, t - 1


class Conversation:
  """A batch of episodes being sampled: the cache, each row's position, the next logits.

  Args:
    model: a `Transformer` (attention, Mamba-2, MoE and MLP layers).
    prompts: each row's first tokens (the rendered first messages).
    cfg: the sampling config; `max_new_tokens` is a turn's budget.
    max_slots: cache slots in all (the prompt's left-padded width, every
      turn's `max_new_tokens` and every appended block, padding included).
    record_experts: keep the experts each token was routed to (the learner
      replays them over the whole episode); the prompt block's are
      `first_experts`.
    prompt_width: left-pad the prompts to at least this many tokens (a
      run's widest: one shape, one compile).
  """

  def __init__(self, model, prompts: Sequence[Sequence[int]], *,
               cfg: SampleConfig, max_slots: int,
               stop_ids: int | Sequence[int],
               pad_id: int = 0, record_experts: bool = False,
               prompt_width: int = 0):
    self.model, self.cfg = model, cfg
    self.stop_ids = _sampler.stop_tuple(stop_ids)
    self.pad_id = pad_id
    self.record_experts = record_experts
    self.graph, self.state = nnx.split(model)
    self.batch = len(prompts)
    self.max_slots = max_slots
    self.index = 0
    self.next_pos = np.zeros(self.batch, np.int32)
    self.cache = model_lib.init_cache(model.cfg, self.batch,
                                      ops.cache_slots(max_slots))
    vocab = model.cfg.vocab_size
    self.logits = jnp.zeros((self.batch, vocab), jnp.float32)
    self.first_experts = self.append(dict(enumerate(prompts)), bucket=1,
                                     width=prompt_width)

  def append(self, rows: Mapping[int, Sequence[int]], *,
             bucket: int = APPEND_BUCKET, width: int = 0) -> np.ndarray | None:
    """Feeds each listed row its tokens (left-padded into one block).

    Returns the experts of the block [B, W, L_moe, k] (or None), W the
    block's width; a row's tokens are its last `len(tokens)` columns.
    """
    longest = max((len(t) for t in rows.values()), default=0)
    if not longest:
      return None
    w = max(-(-longest // bucket) * bucket, width)
    if self.index + w > self.max_slots:
      raise ValueError(
          f'Conversation: a block of {w} tokens at slot {self.index} does not '
          f'fit the cache ({self.max_slots} slots); raise max_slots')
    toks = np.full((self.batch, w), self.pad_id, np.int32)
    valid = np.zeros((self.batch, w), bool)
    pos = np.zeros((self.batch, w), np.int32)
    for r, t in rows.items():
      k = len(t)
      if k:
        toks[r, w - k:] = t
        valid[r, w - k:] = True
        pos[r, w - k:] = self.next_pos[r] + np.arange(k)
        self.next_pos[r] += k
    # Mamba states step over padding after the first block (see above).
    feed = (_feed_steps if self.index and model_lib.MAMBA in
            self.model.cfg.pattern else feed_block)
    # A later block goes in `bucket`-wide column chunks: one program per
    # batch, whatever an observation's width (each width compiled its
    # own, 3-4 a stage). A chunk's queries attend to the cache the chunks
    # before it wrote, as one block's later columns attend to its earlier
    # ones; a row with no token in a chunk keeps its logits.
    step = w if not self.index or w % bucket else bucket
    out = []
    for c in range(0, w, step):
      self.logits, self.cache, experts = feed(
          self.graph, self.state, jnp.asarray(toks[:, c:c + step]),
          jnp.asarray(valid[:, c:c + step]), jnp.asarray(pos[:, c:c + step]),
          self.cache, self.logits)
      out.append(experts)
    self.index += w
    if not (self.record_experts and out[0] is not None):
      return None
    return np.concatenate([np.asarray(sharding.to_host(e)) for e in out], 1)

  def generate(self, active: np.ndarray, key: jax.Array) -> Turn:
    """One reply for each active row, from its next-token logits."""
    if self.index + self.cfg.max_new_tokens > self.max_slots:
      raise ValueError(
          f'Conversation: a turn of {self.cfg.max_new_tokens} tokens at slot '
          f'{self.index} does not fit the cache ({self.max_slots} slots)')
    out, self.cache, self.logits, fed = _turn(
        self.graph, self.state, self.logits, self.cache,
        jnp.asarray(self.next_pos), jnp.asarray(np.asarray(active, bool)), key,
        cfg=self.cfg, stop_ids=self.stop_ids, pad_id=self.pad_id,
        record_experts=self.record_experts)
    toks, lps, mask, kept, stopped, experts = sharding.to_host(out)
    self.index += int(fed)
    lengths = mask.sum(1)
    # Every reply's tokens but its last were fed.
    self.next_pos += np.maximum(lengths - 1, 0).astype(np.int32)
    has_moe = experts is not None and experts.shape[2] > 0
    return Turn(np.asarray(toks), np.asarray(lps), np.asarray(mask),
                np.asarray(kept), np.asarray(stopped),
                np.asarray(experts) if self.record_experts and has_moe
                else None)
