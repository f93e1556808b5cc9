"""Multi-turn episodes: the sampler and environments in turn, and the learner's view of them.

`run_episodes` plays a batch of episodes: the model replies (one
`Conversation` turn for every live episode), each environment reads its
reply and answers, the answers are appended to the KV cache, and so on
until every episode is done. An episode earns the environment's reward when
the environment ends it; it earns 0 when it runs out of turns
(`max_turns`), of tokens (`max_tokens`, prompt included: the next
observation plus a full reply would not fit) or when a reply is cut at
`max_new_tokens` (no stop token: nothing the environment could act on).

An `Episode` keeps each token's log-prob, kept-set size and experts as the
sampler drew it, so the learner's batch of episodes (`rl.from_episodes`)
scores exactly what was sampled (tests/test_episodes.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from cascade_jax import data
from cascade_jax import sharding
from cascade_jax.rollout import _episode_slots
from cascade_jax.rollout._episode import after_step
from cascade_jax.rollout._episode import Episode
from cascade_jax.rollout._episode import EpisodeConfig
from cascade_jax.rollout._episode import make_env
from cascade_jax.rollout._episode import start_episodes
from cascade_jax.rollout._episode import step_envs
from cascade_jax.rollout._episode import take_block
from cascade_jax.rollout._episode import take_reply
from cascade_jax.rollout._episode import turn_keys
from cascade_jax.rollout._sampler import SampleConfig
from cascade_jax.rollout._turns import Conversation


def run_episodes(model, tok: data.Tokenizer, records: Sequence[dict], *,
                 cfg: EpisodeConfig, sample: SampleConfig,
                 key: jax.Array | None = None, record_experts: bool = False,
                 sandbox=None, make=make_env, workers: int = 8,
                 prompt_width: int = 0, timing: dict | None = None,
                 keys: jax.Array | None = None, slots: int = 0,
                 refill: int | None = None, stats: dict | None = None,
                 prefill_rows: int = 0) -> list[Episode]:
  """Plays one episode per record (repeat records for G samples each).

  `sample.max_new_tokens` is ignored (`cfg.max_new_tokens` is a reply's
  budget). `prompt_width`: pad the first messages to at least this many
  tokens (a run's widest: one shape, one compile). Environments that run
  anything use `sandbox` (default: one with `envs.TOOL_LIMITS`).
  `timing`: gets `env_s`, the seconds spent in the environments' steps.

  `keys`: one key an episode ([R]); its turn j's token t is drawn with
  `row_keys(turn_keys(keys, j), t)`, whatever runs beside it. Without it,
  each turn's batch draws from one key split from `key`.
  `slots` > 0: continuous batching: `slots` episodes play at a time (on
  a mesh, rounded up to a multiple of the devices the rows split over), a finished episode's row taking the next waiting one, each
  row on its own turn (`_episode_slots`; `refill` is its); every episode
  equals the fixed batch's with the same `keys` (tokens; log-probs within
  float error). `prefill_rows` (with `slots`): the most rows one prefill
  of new episodes takes (rounded up to a multiple of the batch devices; 0:
  every free row at once), as `generate_continuous`'s: a pod's first fill
  of every slot can need far more memory than the decode loop; the
  episodes are the same. (Observations are fed in place, every row at
  once: no row's cache is copied.) `stats`:
  gets `steps` (decode steps), `row_steps` (tokens sampled) and
  `tokens_per_step`; with `slots` also `places` (prefills of new
  episodes) and `max_prefill` (the most rows one of them took, padding
  included).
  """
  timing = {} if timing is None else timing
  timing.setdefault('env_s', 0.0)
  key = jax.random.key(0) if key is None else key
  sample = dataclasses.replace(sample, max_new_tokens=cfg.max_new_tokens)
  if keys is not None and keys.shape != (len(records),):
    raise ValueError(f'run_episodes: {keys.shape} keys for {len(records)} '
                     'records (give one key an episode)')
  envs, eps = start_episodes(tok, records, cfg, sandbox, make)
  pool = concurrent.futures.ThreadPoolExecutor(max(1, workers))
  try:
    if slots:
      keys = jax.random.split(key, len(eps)) if keys is None else keys
      _episode_slots.play(model, tok, eps, envs, keys, cfg=cfg, sample=sample,
                          slots=slots, refill=refill, pool=pool,
                          record_experts=record_experts, timing=timing,
                          prompt_width=prompt_width, stats=stats,
                          prefill_rows=prefill_rows)
    else:
      _play_fixed(model, tok, eps, envs, key, keys, cfg=cfg, sample=sample,
                  pool=pool, record_experts=record_experts, timing=timing,
                  prompt_width=prompt_width, stats=stats)
  finally:
    pool.shutdown()
  return eps


def _play_fixed(model, tok, eps, envs, key, keys, *, cfg, sample, pool,
                record_experts, timing, prompt_width, stats) -> None:
  """Every episode in one batch, turn by turn, until the last one ends."""
  ctx = getattr(model, 'ctx', None)
  prompts, _ = sharding.pad_rows([e.tokens for e in eps],
                                 1 if ctx is None else ctx.shards('batch'))
  if keys is not None:
    keys, _ = sharding.pad_rows(keys, len(prompts))
  width = max(max(map(len, prompts)), prompt_width)
  conv = Conversation(model, prompts, cfg=sample,
                      max_slots=cfg.slots(width), stop_ids=tok.stop_ids,
                      pad_id=tok.pad_id, record_experts=record_experts,
                      prompt_width=width)
  conv_experts = conv.first_experts
  if conv_experts is not None:
    for i, e in enumerate(eps):
      n = len(e.tokens)
      e.experts = list(conv_experts[i, conv_experts.shape[1] - n:])
  alive = np.zeros(len(prompts), bool)
  alive[:len(eps)] = True
  decode_steps = row_steps = 0
  for turn in range(cfg.max_turns):
    if not alive.any():
      break
    if keys is None:
      key, sub = jax.random.split(key)
    else:
      sub = turn_keys(keys, turn)
    before = conv.index
    out = conv.generate(alive, sub)
    decode_steps += conv.index - before          # decode steps (a token fed each)
    row_steps += int(out.lengths.sum())
    rows = np.flatnonzero(alive[:len(eps)])
    texts = {}
    for i in rows:
      texts[i] = take_reply(eps[i], tok, out.tokens[i], out.logprobs[i],
                             out.kept[i], None if out.experts is None
                             else out.experts[i], int(out.lengths[i]))
    steps = step_envs(pool, envs, {i: texts[i] for i in rows
                                    if out.stopped[i]}, timing)
    feed = {}
    for i in rows:
      toks = after_step(eps[i], tok, cfg, bool(out.stopped[i]), steps.get(i))
      if toks is None:
        alive[i] = False
      else:
        feed[i] = toks
    if feed:
      exps = conv.append(feed)
      if exps is not None:
        for i, toks in feed.items():
          take_block(eps[i], exps[i, exps.shape[1] - len(toks):])
  if stats is not None:
    stats.update(steps=decode_steps, row_steps=row_steps,
                 tokens_per_step=row_steps / max(decode_steps, 1))
