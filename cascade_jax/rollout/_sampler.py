"""Jitted batched generation with the model's KV cache: prefill, then a while_loop of decode steps.

Prompts of different lengths are left-padded (segment 0, never attended) to
a bucketed length, so the sampler compiles once per (batch, prompt bucket,
max new tokens) shape. Each row stops at its stop token; the loop ends when
every row has stopped or the budget is spent.
"""

from __future__ import annotations

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

_NEG = -1e30
_TRACES = [0]
# KV caches kept for reuse (see generate_padded), oldest first.
_CACHE_POOL: dict = {}
_CACHE_POOL_SIZE = 2


def trace_count() -> int:
  """How many times the sampler has been traced (compiled) in this process."""
  return _TRACES[0]


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  max_new_tokens: int = 64
  temperature: float = 1.0      # 0: greedy
  top_p: float = 1.0
  top_k: int = 0                # 0: off
  prompt_bucket: int = 32       # prompts are left-padded to a multiple of this


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Rollout:
  """Generated tokens and what the learner needs about them."""
  tokens: jax.Array        # [B, N] int32, pad after the stop token
  logprobs: jax.Array      # [B, N] log-prob of each token under the sampler
  mask: jax.Array          # [B, N] 1 for response tokens (stop token included)
  truncated: jax.Array     # [B] bool: hit max_new_tokens without stopping
  expert_idx: jax.Array | None  # [B, N, L_moe, k] experts chosen per token
  # [B, N] int32: how many tokens the top-k / top-p set kept at each step
  # (the vocabulary size when neither is on), so that the learner can score
  # a token over the very set it was drawn from (see `keep_top_n`).
  kept: jax.Array | None = None


def process_logits(logits, cfg: SampleConfig):
  """Temperature, top-k and top-p applied to logits [..., V] (fp32).

  Tokens outside the kept set get -1e30: a log-softmax of the result is the
  distribution the sampler draws from, renormalised over the kept set (the
  learner scores its tokens with this same function).
  """
  if cfg.temperature <= 0:
    raise ValueError(f'process_logits: temperature must be > 0, got '
                     f'{cfg.temperature} (0 means greedy: no distribution)')
  logits = logits.astype(jnp.float32) / cfg.temperature
  if cfg.top_k:
    kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, _NEG, logits)
  if cfg.top_p < 1.0:
    sorted_l = jnp.sort(logits, axis=-1)[..., ::-1]
    cum = jnp.cumsum(jax.nn.softmax(sorted_l, axis=-1), axis=-1)
    # Keep the smallest set whose mass reaches top_p (the first always).
    cutoff_idx = jnp.sum(cum < cfg.top_p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(sorted_l, cutoff_idx, axis=-1)
    logits = jnp.where(logits < cutoff, _NEG, logits)
  return logits


def truncates(cfg: SampleConfig) -> bool:
  """Whether sampling keeps only part of the vocabulary (top-k or top-p)."""
  return bool(cfg.top_k) or cfg.top_p < 1.0


def keep_top_n(logits, n):
  """Logits [..., V] with all but the `n` [...] largest set to -1e30.

  Ties with the n-th largest are kept, as `process_logits` keeps them. The
  learner uses it with the sampler's recorded `kept` counts: its own logits
  differ from the sampler's by float rounding, which can move a top-p
  boundary computed again from the cumulative mass (measured on the main
  job's model at top_p 0.95: a 2e-3 log-prob gap on one token of 1,000, 3e-6
  with the counts), but reorders two tokens only when their logits are
  equal to rounding.
  """
  v = logits.shape[-1]
  n = jnp.clip(n, 1, v)
  desc = -jnp.sort(-logits, axis=-1)
  nth = jnp.take_along_axis(desc, (n - 1)[..., None], axis=-1)
  return jnp.where(logits < nth, _NEG, logits)


def stop_tuple(stop_ids: int | Sequence[int]) -> tuple[int, ...]:
  """The ids a reply ends at, as a tuple: one (`-1` or `()`: never stops)
  or several (Qwen3 ends at <|im_end|> or <|endoftext|>)."""
  if isinstance(stop_ids, (int, np.integer)):
    return (int(stop_ids),)
  return tuple(int(s) for s in stop_ids)


def is_stop(toks: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
  """Where `toks` holds any of `stop_ids` (a bool array of its shape)."""
  hit = jnp.zeros(toks.shape, bool)
  for s in stop_ids:
    hit |= toks == s
  return hit


def row_keys(keys: jax.Array, t) -> jax.Array:
  """Each row's key for its draw at step `t` ([] or [B]): `fold_in(keys[b], t)`.

  With a key a row, a row's tokens depend on its own key and step alone,
  not on its slot or on the rows beside it: what continuous batching needs
  (`generate_continuous`), and `generate` takes the same keys.
  """
  return jax.vmap(jax.random.fold_in)(keys, jnp.broadcast_to(t, keys.shape))


def choose_step(t, logits, key, toks, lps, kept, done, *, cfg, pad_id, stop_ids):
  """Samples token t of every row from its logits (pad once a row is done);
  records its log-prob and kept-set size, and which rows are now done.

  `key`: one key, split at every step, or a key a row ([B], see `row_keys`).
  """
  if jnp.ndim(key):
    sub = row_keys(key, t)
  else:
    key, sub = jax.random.split(key)
  tok, lp, n_kept = select_tokens(logits, sub, cfg)
  tok = jnp.where(done, pad_id, tok)
  toks = toks.at[:, t].set(tok)
  lps = lps.at[:, t].set(jnp.where(done, 0.0, lp))
  kept = kept.at[:, t].set(n_kept)
  return tok, key, toks, lps, kept, done | is_stop(tok, stop_ids)


def select_tokens(logits, key, cfg: SampleConfig):
  """Next token, its log-prob under the sampling distribution, and the kept-set size.

  `key`: one key for the batch, or a key a row ([B]).
  """
  v = logits.shape[-1]
  if cfg.temperature == 0.0:
    tok = ops.argmax(logits)
    return tok, jnp.zeros(tok.shape, jnp.float32), jnp.full(tok.shape, v)
  processed = process_logits(logits, cfg)
  logp = jax.nn.log_softmax(processed, axis=-1)
  kept = (jnp.sum(processed > _NEG / 2, axis=-1, dtype=jnp.int32)
          if truncates(cfg) else jnp.full(logits.shape[:-1], v, jnp.int32))
  if jnp.ndim(key):
    noise = jax.vmap(lambda k: jax.random.gumbel(k, (v,), logp.dtype))(key)
  else:
    noise = jax.random.gumbel(key, logp.shape, logp.dtype)
  # Gumbel-max: the same draw as jax.random.categorical(key, logp).
  tok = ops.argmax(noise + logp)
  return tok, jnp.take_along_axis(logp, tok[:, None], -1)[:, 0], kept


def prefill(model, prompt_bp, prompt_len_b, cache, layouts):
  """The left-padded prompts [B, P] (lengths [B]) written into `cache`, a
  new one (nothing written): (the last position's logits [B, 1, V], the
  cache, the prompt's experts)."""
  p = prompt_bp.shape[1]
  pos = jnp.arange(p)[None, :] - (p - prompt_len_b[:, None])   # left-padded
  return _decode.forward(
      model, prompt_bp, positions_bt=jnp.maximum(pos, 0),
      segment_ids_bt=(pos >= 0).astype(jnp.int32), cache=cache,
      layouts=layouts, last_logits_only=True, fresh=True)


def reply_mask(toks, stop_ids, unstopped_length):
  """(mask [B, N] int32 over each reply through its first stop id, or its
  first `unstopped_length` tokens without one; whether it stopped [B])."""
  stops = is_stop(toks, stop_ids)
  has_stop = jnp.any(stops, axis=1)
  length = jnp.where(has_stop, jnp.argmax(stops, axis=1) + 1, unstopped_length)
  mask = jnp.arange(toks.shape[1])[None, :] < length[:, None]
  return mask.astype(jnp.int32), has_stop


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'stop_ids',
                                             'pad_id', 'record_experts'),
                   donate_argnames=('cache_buffers',), keep_unused=True)
def _generate(graph, state, prompt_bp, prompt_len_b, key, cache_buffers, *,
              cfg, stop_ids, pad_id, record_experts):
  _TRACES[0] += 1
  model = nnx.merge(graph, state)
  b, p = prompt_bp.shape
  n = cfg.max_new_tokens
  if cache_buffers is None:
    cache = model_lib.init_cache(model.cfg, b, ops.cache_slots(p + n))
  else:  # zeroed in the donated buffers themselves (kept: keep_unused)
    cache = jax.tree.map(jnp.zeros_like, cache_buffers)
  # The experts laid out once for the decode steps' b tokens (exact paths,
  # no per-step weight copies); the prefill uses the same arrays.
  decode_ws = _decode.model_decode_weights(model, b)
  logits, cache, prompt_experts = prefill(model, prompt_bp, prompt_len_b,
                                          cache, decode_ws)
  n_moe = model.cfg.pattern.count('E')
  k_top = model.cfg.moe.top_k if n_moe else 0
  experts0 = jnp.zeros((b, n, n_moe, k_top), jnp.int32)

  if model.cfg.use_rope:  # every step's rotary tables: [B, N, 1, H/2] each
    rope_all = model_lib.rope_tables(prompt_len_b[:, None] + jnp.arange(n),
                                     model.cfg.head_dim, model.cfg.rope_theta)

  choose = functools.partial(choose_step, cfg=cfg, pad_id=pad_id,
                             stop_ids=stop_ids)

  def cond(c):
    t, *_, done = c
    return (t < n) & ~jnp.all(done)

  def body(c):
    # Feeds token t - 1, then samples token t: the last token sampled is
    # never fed (a final model step would compute logits nobody reads).
    t, tok, cache, key, toks, lps, kept, experts, done = c
    rope_t = (tuple(jax.lax.dynamic_slice_in_dim(x, t - 1, 1, axis=1)
                    for x in rope_all) if model.cfg.use_rope else None)
    logits, cache, step_experts = _decode.forward(
        model, tok[:, None], positions_bt=(prompt_len_b + t - 1)[:, None],
        segment_ids_bt=jnp.ones((b, 1), jnp.int32), cache=cache,
        layouts=decode_ws, rope_cs=rope_t)
    if record_experts and n_moe:
      # The experts that consumed token t - 1: the training forward pass
      # over the sampled sequence routes that token with these.
      experts = experts.at[:, t - 1].set(step_experts[:, 0])
    tok, key, toks, lps, kept, done = choose(t, logits[:, -1], key, toks, lps,
                                             kept, done)
    return (t + 1, tok, cache, key, toks, lps, kept, experts, done)

  tok, key, toks, lps, kept, done = choose(
      0, logits[:, -1], key, jnp.full((b, n), pad_id, jnp.int32),
      jnp.zeros((b, n), jnp.float32),
      jnp.full((b, n), model.cfg.vocab_size, jnp.int32), jnp.zeros((b,), bool))
  init = (jnp.ones((), jnp.int32), tok, cache, key, toks, lps, kept,
          experts0, done)
  t, _, cache, _, toks, lps, kept, experts, done = jax.lax.while_loop(
      cond, body, init)
  mask, has_stop = reply_mask(toks, stop_ids, t)
  if not (record_experts and n_moe):
    prompt_experts = None
  return Rollout(tokens=toks, logprobs=lps * mask, mask=mask,
                 truncated=~has_stop, kept=kept,
                 expert_idx=(jnp.concatenate([prompt_experts, experts], 1)
                             if prompt_experts is not None else None)), cache


# Made on the device (eagerly, `jnp.zeros` would send each fill value).
_new_cache = jax.jit(model_lib.init_cache, static_argnums=(0, 1, 2))


def pad_prompts(prompts: Sequence[Sequence[int]], bucket: int,
                pad_id: int, *, width: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads to the bucketed maximum length, or at least `width`: ([B, P], lengths [B]).

  A fixed `width` (the longest prompt a run can see) gives every batch one
  shape: one sampler compile, one learner compile.
  """
  if not prompts or any(len(x) == 0 for x in prompts):
    raise ValueError('every prompt must have at least one token')
  longest = max(len(x) for x in prompts)
  p = max(-(-longest // bucket) * bucket, width)
  out = np.full((len(prompts), p), pad_id, np.int32)
  for i, x in enumerate(prompts):
    out[i, p - len(x):] = x
  return out, np.asarray([len(x) for x in prompts], np.int32)


def generate(model: nnx.Module, prompts: Sequence[Sequence[int]], *,
             cfg: SampleConfig, stop_ids: int | Sequence[int],
             pad_id: int = 0,
             key: jax.Array | None = None,
             record_experts: bool = False) -> Rollout:
  """Samples one continuation per prompt (repeat prompts for G samples).

  `key`: one key for the batch (split at every step), or a key a row
  ([B], `row_keys`: a row's draws then depend on its key alone, as in
  `generate_continuous`).

  With `record_experts`, `expert_idx` holds the experts of every position of
  prompt + response ([B, P + N, L_moe, k], prompt left-padded to P), ready
  to replay in the learner's forward pass; the last token sampled, never fed
  to the model, has zeros (the learner's inputs stop before it).
  """
  tokens, lengths = pad_prompts(prompts, cfg.prompt_bucket, pad_id)
  return generate_padded(model, tokens, lengths, cfg=cfg, stop_ids=stop_ids,
                         pad_id=pad_id, key=key, record_experts=record_experts)


def generate_padded(model: nnx.Module, tokens_bp, lengths_b, *,
                    cfg: SampleConfig, stop_ids: int | Sequence[int],
                    pad_id: int = 0,
                    key: jax.Array | None = None,
                    record_experts: bool = False,
                    min_rows: int = 0) -> Rollout:
  """`generate` on prompts already left-padded by `pad_prompts`.

  The rows are padded (copies of the last) to at least `min_rows` (a
  batch of fewer prompts in a larger one's shape: one compile for both)
  and, on a mesh, to a multiple of the devices the batch is split over;
  the padding is dropped from the result: a row's tokens do not depend on
  the padding (its Gumbel noise is a prefix of the larger batch's, and
  decoding is per row).
  """
  ctx = getattr(model, 'ctx', None)
  rows = (np.asarray(tokens_bp), np.asarray(lengths_b))
  per_row = key is not None and jnp.ndim(key) > 0
  if per_row and key.shape != (len(rows[1]),):
    raise ValueError(f'generate: {key.shape[0]} keys for {len(rows[1])} rows '
                     '(give one key, or one a row)')
  rows += (key,) if per_row else ()
  n = len(rows[1])
  if min_rows > n:
    rows, _ = sharding.pad_rows(rows, min_rows)
  rows, _ = sharding.pad_rows(rows, 1 if ctx is None else ctx.shards('batch'))
  tokens_bp, lengths_b = rows[:2]
  key = rows[2] if per_row else key
  if n < len(lengths_b):
    out = generate_padded(model, tokens_bp, lengths_b, cfg=cfg,
                          stop_ids=stop_ids, pad_id=pad_id, key=key,
                          record_experts=record_experts)
    return jax.tree.map(lambda x: x[:n], out)
  graph, state = nnx.split(model)
  key = jax.random.key(0) if key is None else key
  # The prompts' one way in (explicit: allowed under a transfer guard).
  tokens_bp, lengths_b = jax.device_put((tokens_bp, lengths_b))
  b, p = tokens_bp.shape
  # On the CPU an unsharded model's KV cache is kept between calls of one
  # shape and donated back: XLA:CPU takes a fresh cache from the OS at every
  # call otherwise, and its first touch page-faults (at batch 64 in the
  # benchmark, 25 MB: ~10 ms of a 400 ms generation).
  reuse = jax.default_backend() == 'cpu' and getattr(model, 'ctx', None) is None
  slots = ops.cache_slots(p + cfg.max_new_tokens)
  pool_key = (model.cfg, b, slots)
  buffers = _CACHE_POOL.pop(pool_key, None) if reuse else None
  if reuse and buffers is None:
    buffers = _new_cache(model.cfg, b, slots)
  out, cache = _generate(graph, state, tokens_bp, lengths_b, key,
                         buffers, cfg=cfg, stop_ids=stop_tuple(stop_ids),
                         pad_id=pad_id,
                         record_experts=record_experts)
  if reuse:
    _CACHE_POOL[pool_key] = cache
    while len(_CACHE_POOL) > _CACHE_POOL_SIZE:
      _CACHE_POOL.pop(next(iter(_CACHE_POOL)))
  return out
