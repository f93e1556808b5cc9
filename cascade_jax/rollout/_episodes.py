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
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import envs as envs_lib
from cascade_jax import sharding
from cascade_jax.rollout._sampler import SampleConfig
from cascade_jax.rollout._turns import APPEND_BUCKET
from cascade_jax.rollout._turns import Conversation

ENDS = ('done', 'turns', 'budget', 'cut')


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
  max_turns: int = 4
  max_new_tokens: int = 48          # one reply's budget
  max_observation_tokens: int = 96  # an observation beyond this is cut
  max_tokens: int = 384             # the whole episode, prompt included

  def __post_init__(self):
    for k in ('max_turns', 'max_new_tokens', 'max_observation_tokens',
              'max_tokens'):
      if getattr(self, k) < 1:
        raise ValueError(f'episodes.{k} must be >= 1, got {getattr(self, k)}')

  def slots(self, prompt_width: int) -> int:
    """Cache slots for episodes whose prompts are `prompt_width` wide."""
    block = -(-(self.max_observation_tokens + 1) // APPEND_BUCKET
              ) * APPEND_BUCKET
    return (prompt_width + self.max_turns * self.max_new_tokens +
            (self.max_turns - 1) * block)


@dataclasses.dataclass
class Episode:
  """One episode: its tokens (contiguous), what the model sampled of them, its outcome."""
  record: dict
  tokens: list[int]
  model: list[int]              # 1 for a token the model sampled
  logprobs: list[float]         # the sampler's, 0 elsewhere
  kept: list[int]               # the sampler's kept-set sizes, 0 elsewhere
  experts: list[np.ndarray]     # per token [L_moe, k] (empty lists: none)
  reward: float = 0.0
  passed: bool = False
  end: str = ''                 # one of ENDS
  turns: int = 0
  messages: list[dict] = dataclasses.field(default_factory=list)

  @property
  def truncated(self) -> bool:
    return self.end == 'cut'


def make_env(record: dict, sandbox=None):
  """The environment of a record's domain (a single-turn domain: its verifier)."""
  dom = domains.get(record['domain'])
  if dom.env is not None:
    return dom.env(record, sandbox)
  return envs_lib.SingleTurn(dom.verify, sandbox)


_SANDBOX = []


def _tool_sandbox():
  """One sandbox for the environments' tool calls, per process."""
  if not _SANDBOX:
    from cascade_jax.sandbox import Sandbox  # pylint: disable=g-import-not-at-top
    _SANDBOX.append(Sandbox(envs_lib.TOOL_LIMITS))
  return _SANDBOX[0]


def _fit_observation(tok, messages, limit: int) -> list[int]:
  """The observation's tokens, its messages' contents cut until it fits `limit`."""
  ids = data.encode_observation(tok, messages)
  messages = [dict(m) for m in messages]
  while len(ids) > limit:
    longest = max(messages, key=lambda m: len(m['content']))
    text = longest['content']
    cut = text[:int(len(text) * 0.75)] + ' [cut]'
    if len(cut) >= len(text):   # short contents: the marker outgrows the cut
      raise ValueError(f'episodes.max_observation_tokens={limit} is too '
                       'small for the chat template around an observation '
                       f'({len(ids)} tokens with contents of at most '
                       f'{len(text)} characters)')
    longest['content'] = cut
    ids = data.encode_observation(tok, messages)
  return ids


def _start(tok, records, cfg: EpisodeConfig, sandbox, make):
  """Each record's environment and its episode's first tokens."""
  need_sandbox = any(domains.get(r['domain']).needs_sandbox for r in records)
  if need_sandbox and sandbox is None:
    sandbox = _tool_sandbox()
  envs = [make(r, sandbox) for r in records]
  eps = []
  for r, env in zip(records, envs):
    first = env.reset(r)
    ids = data.encode_prompt(tok, first)
    if len(ids) + cfg.max_new_tokens > cfg.max_tokens:
      raise ValueError(
          f"record {r.get('id')}: its prompt is {len(ids)} tokens; with a "
          f'reply of {cfg.max_new_tokens} it exceeds episodes.max_tokens='
          f'{cfg.max_tokens}')
    eps.append(Episode(r, list(ids), [0] * len(ids), [0.0] * len(ids),
                       [0] * len(ids), [], messages=list(first)))
  return envs, eps


def _take_reply(e: Episode, tok, tokens, logprobs, kept, experts, n: int
                ) -> str:
  """Appends a turn's reply (its first `n` tokens) to `e`; returns its text."""
  e.turns += 1
  e.tokens += tokens[:n].tolist()
  e.model += [1] * n
  e.logprobs += logprobs[:n].tolist()
  e.kept += kept[:n].tolist()
  if experts is not None:
    # The reply's last token is fed with the next observation (if any).
    e.experts += list(experts[:n - 1])
    e.experts.append(np.zeros_like(experts[0]))
  text = tok.decode([t for t in tokens[:n] if t not in tok.stop_ids])
  e.messages.append({'role': 'assistant', 'content': text})
  return text


def _after_step(e: Episode, tok, cfg: EpisodeConfig, stopped: bool, step
                ) -> list[int] | None:
  """Ends `e` or appends the environment's observation to it: the tokens
  to feed (the reply's last token, then the observation) or None."""
  if not stopped:
    e.end = 'cut'
  elif step.done:
    e.end, e.reward = 'done', float(step.reward)
    e.passed = bool(step.info.get('passed', e.reward >= 1.0))
  else:
    e.messages += list(step.messages)
    obs = _fit_observation(tok, step.messages, cfg.max_observation_tokens)
    if e.turns == cfg.max_turns:
      e.end = 'turns'
    elif len(e.tokens) + len(obs) + cfg.max_new_tokens > cfg.max_tokens:
      e.end = 'budget'
    else:
      feed = [e.tokens[-1]] + obs
      e.tokens += obs
      e.model += [0] * len(obs)
      e.logprobs += [0.0] * len(obs)
      e.kept += [0] * len(obs)
      return feed
  return None


def _take_block(e: Episode, block) -> None:
  """The experts of a fed block (the reply's last token, then the observation)."""
  e.experts[-1] = block[0]
  e.experts += list(block[1:])


def _step_envs(pool, envs, texts: dict, timing: dict) -> dict:
  t0 = time.perf_counter()
  steps = dict(zip(texts, pool.map(lambda i: envs[i].step(texts[i]), texts)))
  timing['env_s'] += time.perf_counter() - t0
  return steps


def turn_keys(keys: jax.Array, turn) -> jax.Array:
  """Each episode's key for its turn `turn` ([] or [R]: each its own):
  `fold_in(keys[i], turn[i])`; token t of the turn is drawn with `fold_in`
  of that and t (`row_keys`)."""
  return jax.vmap(jax.random.fold_in)(keys, jnp.broadcast_to(turn, keys.shape))


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
  envs, eps = _start(tok, records, cfg, sandbox, make)
  pool = concurrent.futures.ThreadPoolExecutor(max(1, workers))
  try:
    if slots:
      from cascade_jax.rollout import _episode_slots  # pylint: disable=g-import-not-at-top
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
      texts[i] = _take_reply(eps[i], tok, out.tokens[i], out.logprobs[i],
                             out.kept[i], None if out.experts is None
                             else out.experts[i], int(out.lengths[i]))
    steps = _step_envs(pool, envs, {i: texts[i] for i in rows
                                    if out.stopped[i]}, timing)
    feed = {}
    for i in rows:
      toks = _after_step(eps[i], tok, cfg, bool(out.stopped[i]), steps.get(i))
      if toks is None:
        alive[i] = False
      else:
        feed[i] = toks
    if feed:
      exps = conv.append(feed)
      if exps is not None:
        for i, toks in feed.items():
          _take_block(eps[i], exps[i, exps.shape[1] - len(toks):])
  if stats is not None:
    stats.update(steps=decode_steps, row_steps=row_steps,
                 tokens_per_step=row_steps / max(decode_steps, 1))
